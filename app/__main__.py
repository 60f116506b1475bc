"""The launcher: `python -m app --host H --port P` checks the access configuration, then runs uvicorn.

The ASGI app cannot see the address it is bound to before requests arrive, so this is where a server
without API keys refuses to start on a non-loopback address (unless PARLEY_ALLOW_OPEN=1), with a message
that says what to set, and where a keys file that cannot be used stops it before it binds.

It also creates the listening socket itself, with TCP keepalive: connections accepted from it inherit the
options (Linux), so an idle connection (a `?wait=true` request, an event stream between heartbeats) is
probed, and a client whose machine or network vanished is noticed and its wait or stream ended.

Before it binds it reads `.env`, checks the tools file and the models file (startup.py: one line for what
is wrong, not a traceback; every model routable by LiteLLM, without importing it where its files tell),
brings the database to the latest migration (PARLEY_MIGRATE, app.storage.schema) and logs one line that
says what runs: a configuration that cannot serve never listens. Logs go out in the human or the JSON
format (observability/logs.py), the service's own loggers included.
`python -m app migrate-data --from URL --to URL` copies a database into another instead (app.storage.copy);
`python -m app migrate-files --to s3://bucket/prefix` (or `--from`) copies files' bytes between the database
and an object store (app.storage.blobs.copy_blobs).

And it loads the app before uvicorn runs, with the garbage collector paused (`load_app`): part of a cold
start that /healthz waits for.
"""

from __future__ import annotations

import argparse
import gc
import socket
import sys
from collections.abc import Sequence

import uvicorn

from app.chat.auth import ConfigError, load_key_ring, open_mode_refusal
from app.observability.logs import log_config
from app.observability.setup import tracing_configured
from app.settings import Settings
from app.startup import check_models_file, container_advice, load_env_file, load_settings, log_startup_line
from app.storage.schema import SchemaError
from app.storage.schema import prepare as prepare_schema
from app.tools.config import ToolsConfigError, load_tools_config

EXIT_CONFIG = 2
EXIT_STARTUP = 3  # what uvicorn.run exits with when the server did not start

# A connection idle for 30 s gets a probe every 10 s; after 3 unanswered ones it is closed: a vanished
# client is noticed within about a minute. Options the platform lacks are left at its defaults.
KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app", description="Serve Parley with uvicorn.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    parser.add_argument("--log-level", default="info", help="uvicorn's log level (default: info)")
    parser.add_argument("--no-access-log", action="store_true", help="do not log each request")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["migrate-data"]:
        return migrate_data(given[1:])
    if given[:1] == ["migrate-files"]:
        return migrate_files(given[1:])
    args = parse_args(given)
    load_env_file()
    settings = load_settings()
    if settings is None:
        return EXIT_CONFIG
    problem = settings.replica_problem() or files_store_problem(settings)
    if problem is not None:
        print(f"parley: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    refused = check_access(settings, args.host)
    if refused is not None:
        return refused
    try:
        load_tools_config(settings.tools_file)
    except ToolsConfigError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    catalog = check_models_file(settings)
    if catalog is None:
        return EXIT_CONFIG
    config = uvicorn.Config(
        "app.main:app",
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=not args.no_access_log,
        log_config=log_config(settings.log_format, args.log_level, trace_ids=tracing_configured()),
        # No route is a websocket: "auto" would import the websockets library at every start for nothing.
        ws="none",
    )
    try:  # after uvicorn.Config, which configures the logging its line goes through
        prepare_schema(settings.database_url, migrate=settings.migrate)
    except SchemaError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    server = uvicorn.Server(config)
    log_startup_line(settings, catalog, args.host, args.port)
    sock = listening_socket(config)
    try:
        load_app(config)
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0 if server.started else EXIT_STARTUP


def migrate_data(argv: Sequence[str]) -> int:
    """`python -m app migrate-data --from URL --to URL`: copies every row of one database into another
    (SQLite into PostgreSQL), migrating the target first; idempotent; prints the counts, then compares."""
    parser = argparse.ArgumentParser(
        prog="python -m app migrate-data",
        description="Copy a Parley database into another (e.g. SQLite into PostgreSQL).",
    )
    parser.add_argument("--from", dest="source", required=True, help="e.g. sqlite:///data/parley.db")
    parser.add_argument(
        "--to", dest="target", required=True, help="e.g. postgresql://postgres@127.0.0.1/parley"
    )
    args = parser.parse_args(argv)
    # Imported here: serving never needs the copy.
    from app.storage import copy, schema

    found = schema.revisions(args.source)
    if not found.at_head:
        print(
            f"parley: the source is at migration {found.current}, not {found.head}: migrate it first "
            f"(PARLEY_DATABASE_URL=<it> alembic upgrade head)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    schema.upgrade(args.target)
    source, target = copy.open_engine(args.source), copy.open_engine(args.target)
    try:
        for line in copy.copy_report(copy.copy_all(source, target)):
            print(line)
        different = copy.differences(source, target)
    finally:
        source.dispose()
        target.dispose()
    if different:
        for diff in different:
            print(
                f"parley: {diff.table} {diff.key}: source {diff.source} != target {diff.target}",
                file=sys.stderr,
            )
        print("parley: the databases differ (rows above)", file=sys.stderr)
        return 1
    print("identical: every row of every table is the same in both databases")
    return 0


def migrate_files(argv: Sequence[str]) -> int:
    """`python -m app migrate-files --to s3://bucket/prefix` (or `--from`): copies the bytes of every file of
    the database (PARLEY_DATABASE_URL) from where they are to where PARLEY_FILES_URL is to name next: from the
    database into the bucket, or back. Idempotent; the AWS variables as the server reads them."""
    parser = argparse.ArgumentParser(
        prog="python -m app migrate-files",
        description="Copy files' bytes between the database and an S3-compatible object store.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", dest="target", help="s3://bucket/prefix: from the database into the bucket")
    where.add_argument("--from", dest="source", help="s3://bucket/prefix: from the bucket into the database")
    args = parser.parse_args(argv)
    load_env_file()
    settings = load_settings()
    if settings is None:
        return EXIT_CONFIG
    url = args.target or args.source
    problem = files_store_problem(settings.model_copy(update={"files_url": url}))
    if problem is not None:
        print(f"parley: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    # Imported here: serving never needs the copy.
    import asyncio

    from app.storage import blobs, schema
    from app.storage.engine import Database

    found = schema.revisions(settings.database_url)
    if not found.at_head:
        print(
            f"parley: the database is at migration {found.current}, not {found.head}: migrate it first",
            file=sys.stderr,
        )
        return EXIT_CONFIG

    async def run() -> blobs.BlobCopy:
        database = Database(settings.database_url)
        in_database = blobs.DatabaseBlobs(database, settings.files_chunk_bytes)
        in_bucket = blobs.open_blobs(url, database, settings.files_chunk_bytes)
        try:
            source, target = (in_database, in_bucket) if args.target else (in_bucket, in_database)
            return await blobs.copy_blobs(database, source, target)
        finally:
            await in_bucket.close()
            await database.dispose()

    done = asyncio.run(run())
    print(f"files' blobs: {done.blobs} held by files, {done.copied} copied ({done.bytes} bytes)")
    for sha256 in done.missing:
        print(f"parley: blob {sha256}: absent or not its bytes at the source", file=sys.stderr)
    return 1 if done.missing else 0


def files_store_problem(settings: Settings) -> str | None:
    """Why the files' settings cannot be used: PARLEY_FILES_URL's object store as configured (its AWS
    variables); None if they can."""
    if not settings.files_url:
        return None
    # Imported here: a service that keeps its files in the database never loads the object store.
    from app.storage.object_store import S3Location

    try:
        S3Location.from_env(settings.files_url)
    except ValueError as exc:
        return str(exc)
    return None


def check_access(settings: Settings, host: str) -> int | None:
    """The exit code when the access configuration forbids serving on `host`, else None."""
    try:
        refusal = open_mode_refusal(settings, load_key_ring(settings), host)
    except ConfigError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if refusal is not None:
        print(f"parley: refusing to start. {container_advice(refusal, host)}", file=sys.stderr)
        return EXIT_CONFIG
    return None


def load_app(config: uvicorn.Config) -> None:
    """Imports and builds the app (what uvicorn does first when it runs), with the collector paused.

    Building it allocates ~180k objects that live as long as the process: modules, routes, their pydantic
    schemas. While they pile up, the collector's passes over them took ~0.13 s of CPU (of ~0.9 s before
    /healthz answered) and found almost nothing to free (about 2,000 unreachable objects, measured). So no
    collection meanwhile; afterwards they go to the permanent generation, out of every later pass (as the
    model layer does with litellm's import, which starts later, with the collector running again).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        config.load()
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def listening_socket(config: uvicorn.Config) -> socket.socket:
    """uvicorn's own bound socket (its address handling, errors and "running on" message), with keepalive."""
    sock = config.bind_socket()
    enable_keepalive(sock)
    return sock


def enable_keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


if __name__ == "__main__":
    sys.exit(main())
