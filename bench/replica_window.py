"""A measurement window over several replicas (bench/replicas.py): each replica's CPU and event-loop lag,
the upstream's and the load client's CPU, how busy every core of the machine was, and the CPU of Redis and
of PostgreSQL's processes.

Unlike load.Probe (one server alone on its core), the replicas share the machine with the upstream, the
load client, PostgreSQL and Redis: so the window reports every core's busy share rather than "others on
the server's core", which here would count our own processes.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import Any

from bench.client import HttpConn
from bench.procs import ServerProcess, UpstreamProcess, core_busy_seconds, cpu_seconds


class RedisCpu:
    """Redis's own CPU seconds (INFO cpu: user + sys of the server process, whoever else uses it)."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=5)

    def __enter__(self) -> RedisCpu:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._client.close()

    def seconds(self) -> float | None:
        import redis

        try:
            info = self._client.info("cpu")
        except (redis.RedisError, OSError):
            return None
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of every PostgreSQL process on this machine, by pid (its backends for every database,
    ours among them, and its own workers): where a core's time went that none of our processes took."""
    found: dict[int, float] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="utf-8") as comm:
                if comm.read().strip() != "postgres":
                    continue
            found[int(entry)] = cpu_seconds(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _cores() -> list[int]:
    """Every core of the machine (not the orchestrator's affinity: it pinned itself to one)."""
    return list(range(os.cpu_count() or 1))


class Window:
    def __init__(self, replicas: list[ServerProcess], upstream: UpstreamProcess, redis_cpu: RedisCpu) -> None:
        self.replicas = replicas
        self.upstream = upstream
        self.redis_cpu = redis_cpu
        self.conns = [HttpConn(replica.port) for replica in replicas]
        self._start: dict[str, Any] = {}

    def _sample(self) -> dict[str, Any]:
        return {
            "wall": time.monotonic(),
            "replicas": [replica.cpu_seconds() for replica in self.replicas],
            "upstream": self.upstream.cpu_seconds(),
            "client": time.process_time(),
            "cores": {core: core_busy_seconds(core) for core in _cores()},
            "redis": self.redis_cpu.seconds(),
            "postgres": postgres_cpu(),
        }

    async def start(self) -> None:
        for conn in self.conns:
            await conn.json("POST", "/debug/stats/reset")
        self.upstream.reset()
        self._start = self._sample()

    async def stop(self) -> dict[str, Any]:
        # CPU first: the stats requests below are the harness's, not the workload's.
        end, start = self._sample(), self._start
        wall = end["wall"] - start["wall"]
        replicas = []
        for replica, conn, before, after in zip(
            self.replicas, self.conns, start["replicas"], end["replicas"], strict=True
        ):
            stats = await conn.json("GET", "/debug/stats")
            cpu = after - before
            replicas.append(
                {
                    "port": replica.port,
                    "core": replica.cpu,
                    "cpu_s": round(cpu, 3),
                    "util": round(cpu / wall, 3),
                    "loop_lag": stats["loop_lag"],
                    "rss_mb": round(replica.memory()["rss_mb"], 1),
                }
            )
        busy = {
            str(core): round((end["cores"][core] - start["cores"][core]) / wall, 3)
            for core in start["cores"]
            if start["cores"][core] is not None and end["cores"].get(core) is not None
        }
        redis = None if end["redis"] is None or start["redis"] is None else end["redis"] - start["redis"]
        upstream, client = end["upstream"] - start["upstream"], end["client"] - start["client"]
        # Backends that lived through the window (the replicas' pools keep theirs open).
        postgres = sum(
            cpu - start["postgres"][pid] for pid, cpu in end["postgres"].items() if pid in start["postgres"]
        )
        return {
            "wall_s": round(wall, 3),
            # summary.streaming's CPU per chunk: every replica's CPU, over the chunks the upstream sent.
            "server_cpu_s": round(sum(r["cpu_s"] for r in replicas), 3),
            "replicas": replicas,
            "upstream_util": round(upstream / wall, 3),
            "client_util": round(client / wall, 3),
            "redis_util": None if redis is None else round(redis / wall, 3),
            "postgres_util": round(postgres / wall, 3),
            # Every core's busy share of the window (ours, PostgreSQL's, Redis's and anyone else's work).
            "core_busy_share": busy,
        }

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()
