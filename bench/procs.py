"""Processes of the benchmark: the upstream, the server under test, cores, and /proc readings.

Pinning (when two cores are available): the server under test has core 0 to itself; the upstream and the
load client (the orchestrator's own process) share core 1. The baselines (raw litellm, raw openai) run on
core 0 too, one at a time and while no server runs, so they get the same core the server gets.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Cores:
    """Where each side runs: the server (or a baseline) alone on one core, upstream and load client on
    the other."""

    server: int | None
    other: int | None

    @classmethod
    def plan(cls) -> Cores:
        if not hasattr(os, "sched_getaffinity"):
            return cls(None, None)
        available = sorted(os.sched_getaffinity(0))
        if len(available) < 2:
            return cls(None, None)
        return cls(available[0], available[1])

    def describe(self) -> str:
        if self.server is None:
            return "not pinned (fewer than two cores available)"
        return (
            f"server (and, while no server runs, each baseline) on core {self.server}; "
            f"upstream and load client on core {self.other}"
        )


def pin_self(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def pin(pid: int, cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # the process may have exited already
            os.sched_setaffinity(pid, {cpu})


def raise_nofile() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the new (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft, hard


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid`, from /proc/<pid>/stat (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, so utime (14) and stime (15) are at 11 and 12 here.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc/<pid>/task/*/children.

    The server's LiteLLM child, which runs LiteLLM's streams, is the server's work: its CPU and memory
    count as the server's. (A child that has exited is not counted; the child lives as long as the
    server.)
    """
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as children:
                    kids = [int(x) for x in children.read().split()]
            except (OSError, ValueError):
                continue
            found += kids
            pending += kids
    return found


def tree_cpu_seconds(pid: int) -> float:
    """cpu_seconds of `pid` and of every live process below it."""
    total = cpu_seconds(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(child)
    return total


def core_busy_seconds(cpu: int | None) -> float | None:
    """Seconds core `cpu` has been busy (user, nice, system, irq, softirq, steal) since boot: /proc/stat.

    Over a window, this minus the CPU of our own process pinned there is what everything else (other
    people's processes, the hypervisor's steal) took from that core."""
    if cpu is None:
        return None
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                if line.startswith(f"cpu{cpu} "):
                    ticks = [int(x) for x in line.split()[1:]]
                    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
                    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS
    except (OSError, ValueError):
        return None
    return None


def runqueue_wait_seconds(pid: int) -> float | None:
    """How long the process's main thread (the event loop) has waited, runnable, for a CPU.

    /proc/<pid>/schedstat: on-CPU ns, runqueue-wait ns, timeslices. On a pinned core that wait is time
    another process (or the server's own threads) had the core: the noise of a shared machine."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of `pid`, in MB."""
    found: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                found[line.split(":")[0]] = int(line.split()[1]) / 1024
    return {"rss_mb": found.get("VmRSS", 0.0), "peak_rss_mb": found.get("VmHWM", 0.0)}


def children_rss_mb(pid: int) -> float:
    """RSS of every live process below `pid` (the LiteLLM child), in MB."""
    total = 0.0
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            total += memory_mb(child)["rss_mb"]
    return total


def reset_peak(pid: int) -> bool:
    """Resets VmHWM to the current RSS (clear_refs 5), so a stage's peak is its own; False if refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def http(port: int, method: str, path: str, timeout: float) -> tuple[int, bytes]:
    """A blocking one-shot request without a body on 127.0.0.1 (polling a starting process, the
    upstream's /_control routes): the status and the body."""
    length = "" if method == "GET" else "Content-Length: 0\r\n"
    request = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{length}Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request.encode())
        data = bytearray()
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def _stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _joinable(record: dict[str, Any]) -> dict[str, Any]:
    """A request the fake upstream recorded, as bench/summary.py joins it with a turn: `start` (received),
    `first` (first text chunk written), `end` (last byte written; None unless the answer completed),
    `disconnected` (when the client left), `sent` (text chunks written) and the client's `user_agent`."""
    complete = record["finished_at"] is not None and not record["disconnected"] and not record["cut"]
    return {
        "tag": record["tag"],
        "start": record["received_at"],
        "first": record["first_content_at"],
        "end": record["finished_at"] if complete else None,
        "disconnected": record["disconnected_at"],
        "sent": record["content_sent"],
        "user_agent": record["headers"].get("user-agent", ""),
    }


class UpstreamProcess:
    """The test suite's fake upstream (`python -m tests.fakes.upstream`) on a free port, pinned to `cpu`.

    Its default answer is `chunks` words `delay_ms` apart; a request's `[bench ...]` directive overrides
    both and tags the request, and /_control/requests lists what it recorded."""

    def __init__(self, cpu: int | None, chunks: int, delay_ms: float, log_path: Path) -> None:
        self.cpu = cpu
        self.chunks = chunks
        self.delay_ms = delay_ms
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        args = [sys.executable, "-m", "tests.fakes.upstream", "--chunks", str(self.chunks)]
        args += ["--delay-ms", str(self.delay_ms)]
        if self.cpu is not None:
            args += ["--cpu", str(self.cpu)]
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
        log.close()
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            # "fake upstream listening on http://127.0.0.1:PORT/v1"
            line = self.process.stdout.readline()
            if line.startswith(b"fake upstream listening on "):
                self.port = int(line.split()[-1].rsplit(b":", 1)[1].split(b"/")[0])
                return
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError(f"the upstream did not start: {line!r}; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def by_tag(self) -> dict[str, dict[str, Any]]:
        """The tagged requests since the last reset, by tag."""
        _, body = http(self.port, "GET", "/_control/requests", timeout=10)
        requests: list[dict[str, Any]] = json.loads(body)["requests"]
        return {r["tag"]: _joinable(r) for r in requests if r.get("tag")}

    def reset(self) -> None:
        http(self.port, "POST", "/_control/reset", timeout=5)

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            if self.process.stdout is not None:
                self.process.stdout.close()


def migrate(database_path: Path, log_path: Path) -> None:
    env = {**os.environ, "PARLEY_DATABASE_URL": f"sqlite+aiosqlite:///{database_path}"}
    with log_path.open("ab") as log:
        subprocess.run(
            [sys.executable, "-m", "alembic", "upgrade", "head"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )


def copy_database(template: Path, target: Path) -> None:
    shutil.copyfile(template, target)


@dataclass
class StartTimes:
    healthz_s: float
    readyz_s: float
    saw_loading: bool
    rss_at_healthz_mb: float
    cpu_at_healthz_s: float


class ServerProcess:
    """`python -m app` (the launcher `make run` uses) on a free port, pinned to `cpu`."""

    def __init__(self, env: dict[str, str], cpu: int | None, log_path: Path) -> None:
        self.env = env
        self.cpu = cpu
        self.log_path = log_path
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def spawn(self) -> None:
        kept = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
        env = {**kept, "PYTHONUNBUFFERED": "1", **self.env}
        args = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--log-level", "warning", "--no-access-log"]
        with self.log_path.open("ab") as log:
            self.spawned_at = time.monotonic()
            self.process = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        # Pinned at once, long before the interpreter starts a thread: every thread inherits the core.
        pin(self.process.pid, self.cpu)

    def wait_started(self, timeout: float = 60.0) -> StartTimes:
        """Polls /healthz every 2 ms, then /readyz every 20 ms; times are from the spawn.

        Once the server listens every poll is a request it serves on its own core while the model layer
        loads, so /readyz is polled less often: its resolution is 20 ms."""
        healthz = self._poll("/healthz", timeout)[0]
        rss_at_healthz = self.memory()["rss_mb"]
        # CPU spent to get there: on a busy machine the wall time is mostly waiting, this is not.
        cpu_at_healthz = self.cpu_seconds()
        saw_loading = False
        deadline = self.spawned_at + timeout
        while True:
            status = self._poll("/readyz", deadline - time.monotonic())[1]
            if status == 200:
                ready = time.monotonic() - self.spawned_at
                return StartTimes(healthz, ready, saw_loading, rss_at_healthz, cpu_at_healthz)
            saw_loading = saw_loading or status == 503
            time.sleep(0.02)

    def _poll(self, path: str, timeout: float) -> tuple[float, int]:
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not answer {path} in time:\n{self.log_tail()}")
            try:
                status = http(self.port, "GET", path, timeout=2)[0]
            except OSError:
                time.sleep(0.002)
                continue
            if path != "/healthz" or status == 200:
                return time.monotonic() - self.spawned_at, status
            time.sleep(0.002)

    def memory(self) -> dict[str, float]:
        """The server process's own RSS and peak; `children_rss_mb`: its LiteLLM processes' RSS now."""
        return {**memory_mb(self.pid), "children_rss_mb": children_rss_mb(self.pid)}

    def reset_peak(self) -> bool:
        return reset_peak(self.pid)

    def cpu_seconds(self) -> float:
        """The server's CPU, its LiteLLM processes' included (tree_cpu_seconds)."""
        return tree_cpu_seconds(self.pid)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process, timeout=20)
