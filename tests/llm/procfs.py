"""What the kernel says about processes and sockets (Linux /proc): which process holds a TCP connection,
a process's children, whether a pid still runs. Tests use it to prove where work happens, not how fast."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROC = Path("/proc")

needs_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not (PROC / "net" / "tcp").exists(), reason="reads Linux /proc"
)

_ESTABLISHED = "01"


def _client_socket_inodes(remote_port: int) -> set[str]:
    """Inodes of the established TCP sockets whose peer listens on `remote_port` (the client ends)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        path = PROC / "net" / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == _ESTABLISHED and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                inodes.add(inode)
    return inodes


def connection_owners(remote_port: int) -> set[int]:
    """The pids of the processes holding an open TCP connection to `remote_port` on this machine."""
    wanted = {f"socket:[{inode}]" for inode in _client_socket_inodes(remote_port)}
    owners: set[int] = set()
    if not wanted:
        return owners
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:  # closed meanwhile (the listing's own descriptor, for one)
                continue
            if link in wanted:
                owners.add(int(entry.name))
                break
    return owners


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # After the command name (which may hold spaces): state, then the parent's pid.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def running(pid: int) -> bool:
    """Whether `pid` exists and has not exited (a zombie has exited: it only waits to be reaped)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
