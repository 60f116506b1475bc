"""What every stage shares: the configuration, the cores, the upstream, the working directory, and how a
server under test is configured and started."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.plan import Config
from bench.procs import Cores, ServerProcess, UpstreamProcess, copy_database, migrate

MODELS_FILE = "models.json"


def say(message: str) -> None:
    """Progress on stderr, so that a long run shows where it is."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Context:
    config: Config
    cores: Cores
    work: Path
    upstream: UpstreamProcess
    template_db: Path
    models_file: Path
    # Peak RSS (VmHWM, MB) of every server process, by label.
    server_peaks: dict[str, float] = field(default_factory=dict)

    @classmethod
    def prepare(cls, config: Config, cores: Cores, work: Path, upstream: UpstreamProcess) -> Context:
        """Migrates one template database (each server gets a copy) and writes the models file."""
        template = work / "template.db"
        if template.exists():
            template.unlink()
        migrate(template, work / "migrate.log")
        models_file = work / MODELS_FILE
        provider = {"api_base": upstream.api_base, "models": ["openai/bench"]}
        # The Anthropic reader appends /v1/messages to the server's root; max_tokens as a short answer's.
        claude = {
            "api_base": upstream.api_base.removesuffix("/v1"),
            "max_output_tokens": 1024,
            "models": ["anthropic/bench"],
        }
        providers = {"bench": provider, "claude-bench": claude}
        models_file.write_text(json.dumps({"providers": providers}), encoding="utf-8")
        return cls(config, cores, work, upstream, template, models_file)

    def fresh_db(self, label: str) -> Path:
        target = self.work / f"{label}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        copy_database(self.template_db, target)
        return target

    def server_env(
        self, db: Path, *, adapter: str | None, debug: bool, extra: dict[str, str]
    ) -> dict[str, str]:
        env = {
            "PARLEY_DATABASE_URL": f"sqlite+aiosqlite:///{db}",
            "PARLEY_MODELS_FILE": str(self.models_file),
            "PARLEY_DEMO_TOKEN_DELAY": f"{self.config.demo_delay:g}",
            # Every request is the same (anonymous) principal: the per-principal limits would measure
            # themselves, not the server.
            "PARLEY_MAX_STREAMS_PER_PRINCIPAL": "0",
            "PARLEY_MESSAGES_PER_MINUTE": "0",
        }
        if debug:
            env["PARLEY_DEBUG_STATS"] = "1"
            if self.config.stall_ms:
                env["PARLEY_DEBUG_STALL_MS"] = f"{self.config.stall_ms:g}"
        if adapter is not None and adapter != "anthropic":  # that one is the default server, another model
            # A server without the knob ignores it (unknown PARLEY_ variables are allowed).
            env["PARLEY_STREAM_ADAPTER"] = adapter
        env.update(extra)
        return env

    def spawn(
        self,
        label: str,
        *,
        db: Path | None = None,
        adapter: str | None = None,
        debug: bool = True,
        extra: dict[str, str] | None = None,
        core: int | None = None,
    ) -> ServerProcess:
        """A server on the server's core, or on `core` (a second replica gets the other one)."""
        env = self.server_env(db or self.fresh_db(label), adapter=adapter, debug=debug, extra=extra or {})
        cpu = self.cores.server if core is None else core
        server = ServerProcess(env, cpu, self.work / f"server-{label}.log")
        server.spawn()
        return server

    @contextmanager
    def server(
        self,
        label: str,
        *,
        db: Path | None = None,
        adapter: str | None = None,
        extra: dict[str, str] | None = None,
        core: int | None = None,
    ) -> Iterator[ServerProcess]:
        """A started server (ready: the model layer loaded) with debug stats; stopped on the way out."""
        server = self.spawn(label, db=db, adapter=adapter, extra=extra, core=core)
        try:
            server.wait_started()
            yield server
        finally:
            self.stop(label, server)

    def stop(self, label: str, server: ServerProcess) -> None:
        if server.process is not None and server.process.poll() is None:
            with suppress(OSError):
                self.server_peaks[label] = round(server.memory()["peak_rss_mb"], 1)
        server.stop()

    def dump(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Raw per-turn records in the working directory, for whoever wants to look closer."""
        with (self.work / f"{name}.jsonl").open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
