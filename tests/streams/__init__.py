"""The event stream end to end, over a real socket (and, for crash and shutdown, real server processes):
framing, resume, fan-out, NDJSON, retention, crash and SIGTERM. The unit tests of app/streaming/ are in
tests/streaming/."""
