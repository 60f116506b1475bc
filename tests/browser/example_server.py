"""The built example (examples/ai-sdk-react/dist) served as its vite dev server serves it: the page's files
from one origin, and /v1 and /ui proxied to a live Parley, streamed through as they arrive. So the page runs
exactly as built, with no CORS setting on Parley. A reload drops the proxied request, and with it the
upstream one, as a browser talking to Parley directly would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

PROXIED = ("/v1/", "/ui")
# Hop-by-hop headers (RFC 9110 7.6.1) stay on their own hop; the proxy closes each answer's connection.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


class _Handler(SimpleHTTPRequestHandler):
    upstream = ""

    def __init__(self, *args: object, upstream: str, directory: str) -> None:
        self.upstream = upstream
        super().__init__(*args, directory=directory)  # type: ignore[arg-type]

    def do_GET(self) -> None:
        if self.path.startswith(PROXIED):
            self._proxy()
        else:
            super().do_GET()

    def do_POST(self) -> None:
        self._proxy()

    def _proxy(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
        with (
            httpx.Client(timeout=httpx.Timeout(30, read=None)) as client,
            client.stream(self.command, self.upstream + self.path, headers=headers, content=body) as answer,
        ):
            self.send_response(answer.status_code)
            for name, value in answer.headers.multi_items():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("connection", "close")
            self.end_headers()
            try:
                for chunk in answer.iter_raw():
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the page went away (a reload): leaving the block closes the upstream request too
            except httpx.TransportError:
                pass  # Parley went away (the module's server stops): the page sees the connection close
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serve_example(dist: Path, upstream: str) -> Iterator[str]:
    """Serves `dist` on a free loopback port, proxying Parley's routes to `upstream`; yields its base URL."""
    handler = partial(_Handler, upstream=upstream, directory=str(dist))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
