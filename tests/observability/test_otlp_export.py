"""Tried as a new user would: `python -m app` started with OTEL_EXPORTER_OTLP_ENDPOINT exports its spans over
OTLP/HTTP, and its access log line carries the trace id. The receiver is a real HTTP server on a real socket
that decodes each export with the OTLP protobuf schema (opentelemetry-proto), the part of a collector the
test needs. How it proves it: after a turn and a shutdown (which flushes the batch), the received spans
include the request, the turn and its model call, all in the trace the access line names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.server import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.processes]


class Receiver(ThreadingHTTPServer):
    spans: list[tuple[str, str]]  # (name, trace id as hex)


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.server.spans.extend((span.name, span.trace_id.hex()) for span in scope.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(("127.0.0.1", 0), _Handler)
    server.spans = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_turn_is_exported_as_a_trace_and_its_id_is_in_the_access_log(
    receiver: Receiver, database_url: str, tmp_path: Path
) -> None:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OTEL_"))}
    env = {
        **kept,
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_LOG_FORMAT": "json",
        "PARLEY_DEMO_TOKEN_DELAY": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
    }
    port, log = free_port(), tmp_path / "server.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        sid = httpx.post(f"{url}/v1/sessions", json={"tools": []}, timeout=30).json()["id"]
        done = httpx.post(f"{url}/v1/sessions/{sid}/messages?wait=true", json={"content": "hi"}, timeout=60)
        assert done.json()["status"] == "completed"
    finally:
        process.terminate()
        # uvicorn re-raises the SIGTERM it handled once it has shut down (the batch flushed first).
        assert process.wait(timeout=60) in (0, -15), log.read_text()

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    [access] = [line for line in lines if line.get("path") == f"/v1/sessions/{sid}/messages?wait=true"]
    trace_id = access["trace_id"]
    assert trace_id is not None and len(trace_id) == 32
    names = {name for name, trace in receiver.spans if trace == trace_id}
    assert "POST /v1/sessions/{session_id}/messages" in names, receiver.spans
    assert {"invoke_agent parley", "chat parley/demo"} <= names, receiver.spans
