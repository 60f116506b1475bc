"""The zygote: a process that has imported and warmed LiteLLM up once, and forks a fresh LiteLLM child
for each request (litellm_child.py), in milliseconds instead of the seconds an import takes.

A service process starts one, with the first LiteLLM stream (`python -m app.llm.litellm_zygote`, the
service's environment and CPU affinity inherited); it lives until that process exits. It never runs a
stream: each child is a fresh fork of a process that did nothing but load, so no state flows from one
child to the next (a test suite starts many model layers, hence many children, and pays for one import).
A child that dies, or a model layer that stops, costs the next child a fork, not an import.

The control connection is the zygote's stdin, a Unix SOCK_SEQPACKET socket: the zygote says
`ready <VERSION>` once loaded; the service sends `fork` with one file descriptor attached (SCM_RIGHTS):
its child's end of a socket pair, which becomes that child's connection (litellm_wire.py); the zygote
answers with the child's pid. The zygote exits when the control connection closes (the service stopped
or died); children exit when their own connection closes, so none outlives the service. The zygote
ignores SIGCHLD: the kernel reaps its children, none is left a zombie.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from app.llm.litellm_wire import VERSION

log = logging.getLogger(__name__)

# Importing and warming litellm took 2-5 s on a 2-core machine; a busy machine may take several times that.
START_TIMEOUT = 120.0
_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the `app` package


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """The service's handle on its zygote (blocking calls: run them in a thread). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._registered = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def fork(self, connection: socket.socket) -> int:
        """A new child serving `connection` (the child's end, closed here in any case); its pid.

        Starts the zygote first if none runs (or the last one died)."""
        try:
            with self._lock:
                for _ in range(2):
                    control = self._running()
                    try:
                        socket.send_fds(control, [b"fork"], [connection.fileno()])
                        reply = control.recv(32)
                    except OSError:
                        reply = b""
                    if reply.isdigit():
                        return int(reply)
                    log.warning("the LiteLLM zygote did not fork (answer %r): starting another", reply)
                    self._discard()
                raise ZygoteError("the LiteLLM zygote could not fork a child")
        finally:
            connection.close()

    def close(self) -> None:
        """Ends the zygote (its children end with their own connections)."""
        with self._lock:
            self._discard()

    def _running(self) -> socket.socket:
        process, control = self._process, self._control
        if process is not None and control is not None and process.poll() is None:
            return control
        self._discard()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            command = [sys.executable, "-m", "app.llm.litellm_zygote"]
            process = subprocess.Popen(command, stdin=theirs.fileno(), env=_environment())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(START_TIMEOUT)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        if ready != b"ready %d" % VERSION:
            ours.close()
            _end(process, 0.0)
            raise ZygoteError(f"the LiteLLM zygote did not start (it said {ready!r})")
        self._process, self._control = process, ours
        if not self._registered:
            self._registered = True
            atexit.register(self.close)
        return ours

    def _discard(self) -> None:
        process, control = self._process, self._control
        self._process = self._control = None
        if control is not None:
            control.close()  # the zygote's stdin ends: it exits
        if process is not None:
            _end(process, 2.0)


def _end(process: subprocess.Popen[bytes], grace: float) -> None:
    """Waits `grace` seconds for `process` to exit, then kills it; reaps it in any case."""
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _environment() -> dict[str, str]:
    """The service's environment, with the `app` package importable whatever the working directory."""
    env = dict(os.environ)
    paths = [str(_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


# --- in the zygote ----------------------------------------------------------------------------------------


def main() -> int:
    control = socket.socket(fileno=os.dup(0))
    # Children must not hold the control connection: stdin becomes /dev/null.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the children (see litellm_child.py)

    # Here, not with this module: the service imports it for `Zygote` and never runs a child's code.
    from app.llm.litellm_child import prepare

    prepare()
    if threading.active_count() > 1:  # a fork would copy locks held by threads that do not exist there
        print(f"LiteLLM zygote: {threading.enumerate()} still run after the warm-up", file=sys.stderr)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    control.send(b"ready %d" % VERSION)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 64, 4)
        except OSError:
            return 0
        if not data:
            return 0  # the service closed the connection, or exited
        if data != b"fork" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            control.send(b"refused")
            continue
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(_child(fds[0]))
        os.close(fds[0])
        control.send(b"%d" % pid)


def _child(fd: int) -> int:
    code = 1
    try:
        from app.llm.litellm_child import run

        code = run(socket.socket(fileno=fd))
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
