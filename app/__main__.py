"""The launcher: `python -m app --host H --port P` checks the access configuration, then runs uvicorn.

The ASGI app cannot see the address it is bound to before requests arrive, so this is where a server
without API keys refuses to start on a non-loopback address (unless PARLEY_ALLOW_OPEN=1), with a message
that says what to set, and where a keys file that cannot be used stops it before it binds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from app.auth import ConfigError, load_key_ring, open_mode_refusal
from app.settings import Settings

EXIT_CONFIG = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app", description="Serve Parley with uvicorn.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    parser.add_argument("--log-level", default="info", help="uvicorn's log level (default: info)")
    parser.add_argument("--no-access-log", action="store_true", help="do not log each request")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    try:
        refusal = open_mode_refusal(settings, load_key_ring(settings), args.host)
    except ConfigError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if refusal is not None:
        print(f"parley: refusing to start. {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    uvicorn.run(
        "app.main:app",
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=not args.no_access_log,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
