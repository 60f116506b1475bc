"""A real server process: `python -m uvicorn app.main:app` in a child, so kill -9 and SIGTERM are real.

Settings go in as PARLEY_ environment variables, as in production. The child's log (uvicorn's and the
app's) is kept in a file the test can read after the fact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.server import ROOT, free_port


class ServerProcess:
    def __init__(
        self, env: dict[str, str], log_path: Path, *, app: str = "app.main:app", port: int | None = None
    ) -> None:
        """`port`: a restarted server listens where the old one did, so clients reconnect to one URL."""
        self.env = env
        self.log_path = log_path
        self.app = app
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> None:
        """Starts the child and returns once it is ready (the model layer loaded): seconds on a quiet machine,
        past 30 s on a busy 2-core one running the tests on parallel workers (make test)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    self.app,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--no-access-log",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"the server was not ready within {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        """kill -9: nothing runs after this, not even a flush."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the process stops running (a zombie: alive, holding its sockets, doing nothing)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP, by `pause` or by itself): its state in /proc."""
        assert self.process is not None
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def resume(self) -> None:
        """SIGCONT after `pause` (harmless on a process that runs)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def terminate(self, timeout: float = 30.0) -> float:
        """SIGTERM, then the seconds until the process had exited."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=timeout)
        return time.monotonic() - started

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def server_process(
    env: dict[str, str], log_path: Path, *, app: str = "app.main:app", port: int | None = None
) -> Iterator[ServerProcess]:
    server = ServerProcess(env, log_path, app=app, port=port)
    server.start()
    try:
        yield server
    finally:
        server.kill()
