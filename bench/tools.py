"""`python -m bench.tools` (and the `tools` stage of `make bench`): what a tool call costs the service
beyond the tool's own time, for a built-in tool, an MCP server over streamable HTTP and over stdio
(tests/tools/mcp_server.py, written with the SDK's MCPServer), and an HTTP tool (bench/tool_receiver.py).

A real `python -m app` (the demo model at full speed) runs turns that each make one call of one tool,
one after another. For each kind:

* `call_ms`: the call as the server measures it (tool_exec_end's `duration_ms`, from the history):
  argument checks, the client's work, the round trip and the tool's own handling;
* `alone_ms`: the same call made by a bare client in this process with nothing around it (the SDK's
  own `Client.call_tool` against the same MCP server, a plain aiohttp POST to the same receiver): the
  tool's own time, transport included. `added_ms` = call_ms - alone_ms, at p50 (target: <= 5 ms for MCP);
* `server_cpu_ms`: the server process's CPU per turn (threads included, the tool servers not), and
  `beyond_builtin_ms`: what a turn with that tool costs the server beyond a turn with a built-in tool;
* `tool_cpu_ms`: the tool server's own CPU per call.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import httpx2
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from bench.figure import Figure, get

try:
    import uvloop
except ImportError:  # pragma: no cover - uvicorn[standard] brings it
    uvloop = None  # type: ignore[assignment]

from bench.procs import ROOT, cpu_seconds, descendants, free_port, migrate

MCP_SERVER = ROOT / "tests" / "tools" / "mcp_server.py"
SECRET = "bench-secret-0123456789"
ARGUMENTS = {"text": "hello"}
KINDS = {
    "builtin": ("calculate", {"expression": "1+1"}),
    "mcp_http": ("bench_http__echo", ARGUMENTS),
    "mcp_stdio": ("bench_stdio__echo", ARGUMENTS),
    "http": ("bench_echo", ARGUMENTS),
}


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0}
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": round(statistics.median(ordered), 3), "p99": round(p99, 3), "n": len(ordered)}


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=out, stderr=out)


def _wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer")


def _tools_file(work: Path, mcp_port: int, receiver_port: int) -> Path:
    path = work / "tools.yaml"
    config = {
        "mcp_servers": {
            "bench_http": {"url": f"http://127.0.0.1:{mcp_port}/mcp"},
            "bench_stdio": {"command": sys.executable, "args": [str(MCP_SERVER), "stdio"]},
        },
        "http_tools": {
            "bench_echo": {
                "url": f"http://127.0.0.1:{receiver_port}/tool",
                "description": "Echo.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
                "secret": SECRET,
            }
        },
        "allow_private_hosts": ["127.0.0.1"],
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


class Alone:
    """Bare clients of the same tool servers, in a thread of their own, so their calls interleave with
    the server's turns (the machine's load then weighs on both alike). One task enters and leaves the
    MCP clients, as the SDK needs; calls are handed to it through a queue."""

    def __init__(self, mcp_url: str, receiver_url: str) -> None:
        self._mcp_url, self._receiver_url = mcp_url, receiver_url
        # The loop the server runs on (uvicorn picks uvloop when it is installed), so that the two
        # differ by what the server does around a call, not by their event loops.
        self._loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="alone", daemon=True)
        self._thread.start()
        self._jobs: asyncio.Queue[tuple[str, int, Future[list[float]]] | None] = asyncio.Queue()
        self._ready: Future[None] = Future()
        self._served = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self._ready.result(timeout=60)

    async def _serve(self) -> None:
        stdio = StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER), "stdio"])
        # The transport exactly as Parley builds it (app/tools/mcp.py).
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0), follow_redirects=False)
        async with (
            http,
            Client(streamable_http_client(self._mcp_url, http_client=http)) as http_client,
            Client(stdio) as stdio_client,
            aiohttp.ClientSession() as session,
            # As Parley's clients do: a listen stream open beside the calls.
            http_client.listen(tools_list_changed=True),
            stdio_client.listen(tools_list_changed=True),
        ):
            clients = {"mcp_http": http_client, "mcp_stdio": stdio_client}
            self._ready.set_result(None)
            while (job := await self._jobs.get()) is not None:
                kind, count, done = job
                times: list[float] = []
                for _ in range(count):
                    started = time.perf_counter()
                    if kind == "http":
                        await _post_signed(session, self._receiver_url)
                    else:
                        await clients[kind].call_tool("echo", ARGUMENTS)
                    times.append((time.perf_counter() - started) * 1000)
                done.set_result(times)

    def calls(self, kind: str, count: int) -> list[float]:
        done: Future[list[float]] = Future()
        self._loop.call_soon_threadsafe(self._jobs.put_nowait, (kind, count, done))
        return done.result(timeout=300)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._jobs.put_nowait, None)
        self._served.result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _post_signed(session: aiohttp.ClientSession, url: str) -> None:
    body = json.dumps(ARGUMENTS).encode()
    stamp = str(int(time.time()))
    signature = hmac.new(SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    headers = {"X-Parley-Timestamp": stamp, "X-Parley-Signature": f"sha256={signature}"}
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()


def _stdio_pid(server_pid: int) -> int | None:
    for pid in descendants(server_pid):
        try:
            if str(MCP_SERVER) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        except OSError:
            continue
    return None


def _session(api: str, tool: str) -> str:
    with httpx.Client(base_url=api, timeout=60) as client:
        return str(client.post("/sessions", json={"tools": [tool]}).raise_for_status().json()["id"])


def _turns(api: str, sid: str, tool: str, arguments: dict[str, Any], count: int) -> None:
    """Runs `count` turns that each call `tool` once, one after another."""
    content = f"[call:{tool} {json.dumps(arguments)}]"
    with httpx.Client(base_url=api, timeout=60) as client:
        for _ in range(count):
            done = client.post(
                f"/sessions/{sid}/messages", params={"wait": "true"}, json={"content": content}
            )
            if done.status_code != 200 or done.json()["status"] != "completed":
                raise RuntimeError(f"a {tool} turn failed: {done.text[:300]}")


def _call_times(api: str, sid: str) -> list[float]:
    times: list[float] = []
    cursor: str | None = None
    with httpx.Client(base_url=api, timeout=60) as client:
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"after": cursor} if cursor else {})}
            page = client.get(f"/sessions/{sid}/messages", params=params).raise_for_status().json()
            times += [float(m["duration_ms"]) for m in page["chat_messages"] if m["type"] == "tool_group"]
            cursor = page.get("next_cursor")
            if not cursor:
                return times


def measure(work: Path, calls: int = 200) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    mcp_port, receiver_port, port = free_port(), free_port(), free_port()
    procs = {
        "mcp_http": _spawn([sys.executable, str(MCP_SERVER), "http", str(mcp_port)], work / "mcp.log"),
        "http": _spawn(
            [sys.executable, "-m", "bench.tool_receiver", str(receiver_port), SECRET], work / "rx.log"
        ),
    }
    db = work / "tools.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    migrate(db, work / "migrate.log")
    env = {
        "PARLEY_DATABASE_URL": f"sqlite+aiosqlite:///{db}",
        "PARLEY_TOOLS_FILE": str(_tools_file(work, mcp_port, receiver_port)),
        "PARLEY_DEMO_TOKEN_DELAY": "0",
        "PARLEY_MESSAGES_PER_MINUTE": "0",
    }
    server = _spawn(
        [sys.executable, "-m", "app", "--port", str(port), "--no-access-log"], work / "server.log", env
    )
    api = f"http://127.0.0.1:{port}/v1"
    results: dict[str, Any] = {"calls": calls, "kinds": {}}
    try:
        _wait_http(f"http://127.0.0.1:{port}/readyz")
        for _ in range(600):
            states = {
                s["name"]: s["state"] for s in httpx.get(f"{api}/tools", timeout=5).json()["mcp_servers"]
            }
            if set(states.values()) == {"connected"}:
                break
            time.sleep(0.1)
        pids = {**{k: p.pid for k, p in procs.items()}, "mcp_stdio": _stdio_pid(server.pid)}
        alone = Alone(f"http://127.0.0.1:{mcp_port}/mcp", f"http://127.0.0.1:{receiver_port}/tool")
        try:
            results["kinds"] = _interleaved(api, server.pid, pids, alone, calls)
        finally:
            alone.close()
    finally:
        for process in (server, *procs.values()):
            process.terminate()
        for process in (server, *procs.values()):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    return results


def _interleaved(
    api: str, server_pid: int, pids: dict[str, int | None], alone: Alone, calls: int, rounds: int = 5
) -> dict[str, Any]:
    """Each kind in `rounds` blocks, the kinds and the bare clients taking turns, so a busy spell of the
    machine weighs on every kind alike rather than on the one measured at that moment."""
    block = max(1, calls // rounds)
    warm = min(20, calls)
    sessions: dict[str, str] = {}
    cpu = dict.fromkeys(KINDS, 0.0)
    tool_cpu = dict.fromkeys(KINDS, 0.0)
    alone_ms: dict[str, list[float]] = {kind: [] for kind in KINDS if kind != "builtin"}
    for kind, (tool, arguments) in KINDS.items():
        sessions[kind] = _session(api, tool)
        _turns(api, sessions[kind], tool, arguments, warm)  # warm-up
        if kind != "builtin":
            alone.calls(kind, warm)
    for _ in range(rounds):
        for kind, (tool, arguments) in KINDS.items():
            tool_pid = pids.get(kind)
            cpu0, tool0 = cpu_seconds(server_pid), cpu_seconds(tool_pid) if tool_pid else 0.0
            _turns(api, sessions[kind], tool, arguments, block)
            cpu[kind] += cpu_seconds(server_pid) - cpu0
            tool_cpu[kind] += (cpu_seconds(tool_pid) - tool0) if tool_pid else 0.0
            if kind != "builtin":
                alone_ms[kind] += alone.calls(kind, block)
    found: dict[str, Any] = {}
    total = block * rounds
    for kind, (tool, _) in KINDS.items():
        times = _call_times(api, sessions[kind])[warm:]  # the warm-up's first
        entry: dict[str, Any] = {
            "tool": tool,
            "call_ms": _percentiles(times),
            "server_cpu_ms": round(cpu[kind] * 1000 / total, 3),
            "tool_cpu_ms": round(tool_cpu[kind] * 1000 / total, 3) if pids.get(kind) else None,
        }
        if kind in alone_ms:
            entry["alone_ms"] = _percentiles(alone_ms[kind])
            entry["added_ms_p50"] = round(entry["call_ms"]["p50"] - entry["alone_ms"]["p50"], 3)
        found[kind] = entry
    for entry in found.values():
        entry["beyond_builtin_ms"] = round(entry["server_cpu_ms"] - found["builtin"]["server_cpu_ms"], 3)
    return found


def figures(results: dict[str, Any]) -> list[Figure]:
    """The issue's target: an MCP call adds at most 5 ms p50 over the server's own handling (make bench)."""
    found: list[Figure] = []
    for kind, transport in (("mcp_http", "streamable HTTP"), ("mcp_stdio", "stdio")):
        entry = get(results, "tools", "kinds", kind)
        found.append(
            Figure(
                f"tool_{kind}_added_p50_ms",
                f"An MCP tool call over {transport}: time the service adds, p50",
                get(entry, "added_ms_p50"),
                "ms",
                5,
                note=f"call p50 {get(entry, 'call_ms', 'p50')} ms as the server times it, the same call by a "
                f"bare SDK client p50 {get(entry, 'alone_ms', 'p50')} ms; server CPU per turn "
                f"{get(entry, 'server_cpu_ms')} ms "
                f"({get(entry, 'beyond_builtin_ms')} ms beyond a built-in call)",
            )
        )
    return found


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Tool calls, {results['calls']} turns of one call each per kind (bench/tools.py: what each is).",
        "",
        "| tool | call p50 / p99 (ms) | the tool alone p50 / p99 (ms) | added p50 (ms) | target "
        "| server CPU per turn (ms) | beyond a built-in call (ms) | tool server CPU per call (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, found in results["kinds"].items():
        alone = found.get("alone_ms")
        alone_text = f"{alone['p50']} / {alone['p99']}" if alone else "–"
        target = "≤ 5" if kind.startswith("mcp") else "–"
        call = found["call_ms"]
        tool_cpu = found["tool_cpu_ms"] if found["tool_cpu_ms"] is not None else "–"
        lines.append(
            f"| {kind} (`{found['tool']}`) | {call['p50']} / {call['p99']} | {alone_text} "
            f"| {found.get('added_ms_p50', '–')} | {target} | {found['server_cpu_ms']} | "
            f"{found['beyond_builtin_ms']} | {tool_cpu} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    results = measure(ROOT / "bench" / "work" / "tools", calls)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tools.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out / "tools.md").write_text(markdown(results), encoding="utf-8")
    sys.stdout.write(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
