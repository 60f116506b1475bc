"""A real disk that fills (issue 31): `python -m app` on a small tmpfs, a turn running when it fills, a
graceful stop, and a restart while it is still full. The restart stays up and answers (a 503 of storage's
code where SQLite cannot work: on a disk this full it cannot even create the index file a WAL database is
read through), and once space is freed it closes the turn the stop could not close and takes writes.

Mounting a tmpfs needs root (or CAP_SYS_ADMIN): elsewhere the test skips with one line. The in-process
variant, which runs everywhere, is tests/interrupt/test_full_disk_restart.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import ROOT, free_port, migrate

pytestmark = [pytest.mark.slow, pytest.mark.processes]

SAFETY = 60.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount (root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, name: str) -> None:
    """Writes until the disk has no byte left."""
    with (disk / name).open("ab", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass


def launch(url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OTEL_"))}
    env.update(PYTHONUNBUFFERED="1", PARLEY_DATABASE_URL=url, PARLEY_DEMO_TOKEN_DELAY="0.05")
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    base = f"http://127.0.0.1:{port}"
    eventually(lambda: _healthy(process, base, log))
    return process, base


def _healthy(process: subprocess.Popen[bytes], base: str, log: Path) -> bool:
    assert process.poll() is None, f"the server exited:\n{log.read_text()}"
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def eventually(check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + SAFETY
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=SAFETY)


def _refused_write(base: str) -> httpx.Response | None:
    response = httpx.post(f"{base}/v1/sessions", json={"system_prompt": "x" * 20_000}, timeout=10)
    assert response.status_code in (201, 503), response.text
    return response if response.status_code == 503 else None


def history(base: str, sid: str) -> list[dict[str, Any]] | None:
    response = httpx.get(f"{base}/v1/sessions/{sid}/messages", timeout=10)
    return response.json()["chat_messages"] if response.status_code == 200 else None


def test_a_restart_on_a_full_disk_stays_up_and_recovers_once_space_is_freed(
    small_disk: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{small_disk / 'parley.db'}"
    migrate(url)
    first, base = launch(url, tmp_path / "first.log")
    try:
        sid = httpx.post(f"{base}/v1/sessions", json={}, timeout=10).json()["id"]
        posted = httpx.post(f"{base}/v1/sessions/{sid}/messages", json={"content": "[long] hi"}, timeout=10)
        assert posted.status_code == 202, posted.text
        turn = posted.json()["turn_id"]
        eventually(
            lambda: any(r["type"] == "text" and r["role"] == "assistant" for r in history(base, sid) or [])
        )
        fill(small_disk, "filler-1")
    finally:
        stop(first)  # its turn's end cannot be written
    fill(small_disk, "filler-2")  # what the stop freed (the WAL file) is taken too

    log = tmp_path / "second.log"
    second, base = launch(url, log)
    try:
        # Where the stop could not checkpoint, its WAL file stayed, with room inside that SQLite reuses:
        # writes go on until that room is taken too (3 MB at most), then every write is refused.
        refused = eventually(lambda: _refused_write(base))
        assert refused.json()["error"]["code"] in ("storage_full", "storage_error")
        if not (small_disk / "parley.db-wal").exists():  # no WAL to read through: reads are refused too
            assert httpx.get(f"{base}/readyz", timeout=10).status_code == 503

        for filler in small_disk.glob("filler-*"):
            filler.unlink()
        rows = eventually(lambda: [r for r in history(base, sid) or [] if r["type"] == "turn_done"])
        assert [(r["turn_id"], r["status"]) for r in rows] == [(turn, "interrupted")]
        assert httpx.post(f"{base}/v1/sessions", json={}, timeout=10).status_code == 201
        assert second.poll() is None
    finally:
        stop(second)
    assert "Traceback" not in log.read_text()
