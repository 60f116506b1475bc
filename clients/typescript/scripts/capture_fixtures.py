"""Records the fixtures of the client's tests from the real service: `make client-fixtures`.

Starts `python -m uvicorn app.main:app` (the real app, the demo model, a fresh SQLite file in a temporary
directory) on a free port, and for each scenario keeps the raw bytes of the session's SSE stream, exactly
as the server sent them (retry hint, ids, named events, pings if any), and the history
(`GET .../messages`) once the turn has ended. The vitest suites replay these bytes through the client.

Run from the repository root with the project's virtualenv:
`.venv/bin/python clients/typescript/scripts/capture_fixtures.py`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "clients" / "typescript" / "fixtures"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Recorder:
    """Reads one session's SSE stream on a thread, keeping every byte, until told to stop."""

    def __init__(self, base: str, session_id: str) -> None:
        self.raw = bytearray()
        self.opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(base, session_id), daemon=True)
        self._thread.start()
        if not self.opened.wait(10):
            raise RuntimeError("the stream did not open")

    def _read(self, base: str, session_id: str) -> None:
        with (
            httpx.Client(base_url=base, timeout=60) as client,
            client.stream("GET", f"/v1/sessions/{session_id}/events", params={"after": "0"}) as response,
        ):
            response.raise_for_status()
            self.opened.set()
            for chunk in response.iter_raw():
                self.raw.extend(chunk)
                if self._stop.is_set():
                    return

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.raw:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} never came:\n{self.raw.decode(errors='replace')[-2000:]}")
            time.sleep(0.01)

    def count(self, text: str) -> int:
        return self.raw.count(text.encode())

    def stop(self) -> bytes:
        self._stop.set()
        self._thread.join(timeout=2)  # the ping (or the next event) wakes the reading thread
        return bytes(self.raw)


def record(base: str, name: str, steps: list[tuple[str, dict[str, object]]], turns: int) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        session_id = client.post("/v1/sessions", json={"title": name}).json()["id"]
        recorder = Recorder(base, session_id)
        for action, body in steps:
            if action == "post":
                assert client.post(f"/v1/sessions/{session_id}/messages", json=body).status_code == 202
            elif action == "cancel":
                while recorder.count("event: text_delta") < int(str(body["deltas"])):
                    time.sleep(0.005)
                assert client.post(f"/v1/sessions/{session_id}/cancel", json={}).status_code in (200, 202)
            elif action == "wait":
                recorder.wait_for(str(body["text"]))
        deadline = time.monotonic() + 60
        while recorder.count("event: turn_done") < turns:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {turns} turns did not end")
            time.sleep(0.02)
        time.sleep(0.3)  # the token_usage and idle status that follow
        raw = recorder.stop()
        history = client.get(f"/v1/sessions/{session_id}/messages", params={"limit": 1000}).json()
    # Ids of the stream end at its last complete frame: a frame cut by the stop is not kept.
    raw = raw[: max(raw.rfind(b"\r\n\r\n") + 4, raw.rfind(b"\n\n") + 2)]
    (OUT / f"{name}.sse").write_bytes(raw)
    (OUT / f"{name}.history.json").write_text(json.dumps(history, indent=1, ensure_ascii=False) + "\n")
    print(f"{name}: {len(raw)} bytes, {raw.count(b'id: ')} events, {len(history['chat_messages'])} rows")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/parley.db"
        env = {
            **os.environ,
            "PARLEY_DATABASE_URL": url,
            "PARLEY_DEMO_TOKEN_DELAY": "0.005",
            "PARLEY_SSE_PING_INTERVAL": "1",
        }
        subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT, env=env, check=True)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--no-access-log"],
            cwd=ROOT,
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if httpx.get(f"{base}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            record(
                base, "time", [("post", {"content": "what time is it?", "client_message_id": "cm-time-1"})], 1
            )
            record(
                base,
                "stop",
                [("post", {"content": "[long] tell me a story"}), ("cancel", {"deltas": 60})],
                1,
            )
            record(
                base,
                "queued",
                [
                    ("post", {"content": "[long] first"}),
                    ("wait", {"text": "event: text_delta"}),
                    ("post", {"content": "and then?", "delivery": "queue", "client_message_id": "cm-q-2"}),
                ],
                2,
            )
            record(base, "calc", [("post", {"content": "what is 2+3*4?"})], 1)
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
