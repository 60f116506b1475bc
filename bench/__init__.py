"""Parley's benchmark harness: `python -m bench.run` (or `make bench`); see bench/README.md."""
