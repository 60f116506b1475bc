"""What a benchmark run does: sizes of every stage, for the full run and for the CI smoke.

Every stage reads its sizes from one `Config`, so `--smoke` is the same code with tiny numbers, and the
JSON records the configuration that produced its figures.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

STAGES = (
    "cold_start",
    "baselines",
    "sweep",
    "stop",
    "demo",
    "burst",
    "storage",
    "idle_streams",
    "retained",
    "postgres",
    "tools",
    "compaction",
    "replicas",
)
# "auto" is the server's default (the lean reader for the OpenAI-compatible model); "litellm" forces
# litellm's stream for every model through PARLEY_STREAM_ADAPTER (ignored by servers without it);
# "anthropic" is the default server with an anthropic/ model: the native Anthropic Messages reader against
# the same upstream's /v1/messages.
ADAPTERS = ("auto", "litellm", "anthropic")
SDKS = ("litellm", "openai")


@dataclass(frozen=True)
class Config:
    smoke: bool = False
    # The concurrency sweep: C sessions, each running `rounds(C)` turns back to back.
    levels: tuple[int, ...] = (1, 10, 50, 100)
    chunks: int = 200
    delay_ms: float = 20.0
    samples: int = 100  # turns wanted per level; rounds are clamped to [min_rounds, max_rounds]
    min_rounds: int = 2
    max_rounds: int = 5
    # Session i of C starts its first turn at i * ramp_s / C: C sessions all posting in the same
    # millisecond measure a burst of POSTs rather than C concurrent streams.
    ramp_s: float = 1.0
    adapters: tuple[str, ...] = ADAPTERS
    # Stop: `stop_sessions` stream back to back; every other one is cancelled mid-stream in each round.
    stop_sessions: int = 50
    stop_chunks: int = 200
    stop_rounds: int = 3
    stop_after_s: float = 0.5  # earliest cancel after the first text_delta; a jitter of up to 1 s is added
    # The burst (bench/burst.py): `burst_sessions` turns posted at the same moment on fresh sessions whose
    # streams are open, against as many direct requests to the upstream, `burst_rounds` times.
    burst_sessions: int = 50
    burst_rounds: int = 3
    # The in-process demo model, paced.
    demo_levels: tuple[int, ...] = (50, 200)
    demo_delay: float = 0.02
    # Start-up.
    cold_starts: int = 5
    idle_s: float = 2.0
    # Storage.
    messages: int = 10_000
    events: int = 10_000
    page_size: int = 100
    page_calls: int = 100
    replays: int = 5
    # Idle open streams.
    idle_streams: int = 2_000
    # What a server keeps per session served (bench/retained.py): sessions in each of two waves.
    retained_sessions: int = 1_000
    # Tool calls (bench/tools.py): turns of one call each, per kind of tool.
    tool_calls: int = 200
    # Context compaction (bench/compaction.py): a session of this many turns, planned this many times.
    compaction_turns: int = 200
    compaction_repeats: int = 5
    # Several replicas (bench/replicas.py). Capacity: the most sessions whose turns keep duration p50 within
    # `replica_ratio_limit` of the upstream's, found by stepping the level from `replica_start` (one
    # replica; two start at 1.8 times its capacity, stepping twice as far; a failing level is halved) and
    # halving the gap once a level passed and one failed; at most `replica_searches` levels each, and
    # `replica_rounds` turns a session.
    # One replica's search must end on a failing level: a floor for one replica overstates the ratio.
    replica_start: int = 60
    replica_step: int = 40
    replica_searches: int = 8
    replica_rounds: int = 2
    replica_ratio_limit: float = 1.10
    # Cross-replica delivery (streams on both replicas) and cancel (sent to the replica without the turn).
    replica_delivery_sessions: int = 40
    replica_cancel_sessions: int = 40
    # The stop stage's answer length; unlike its smoke size kept in the smoke too (1 s at 5 ms): a stop
    # crossing replicas on a busy machine can outlast a 0.2 s turn, and then measures nothing.
    replica_cancel_chunks: int = 200
    stages: tuple[str, ...] = STAGES
    # PARLEY_DEBUG_STALL_MS for every server with debug stats: where the loop was when it stalled this
    # long (app/monitor.py). Off by default: the sampler thread takes the GIL, a little.
    stall_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def rounds(self, level: int) -> int:
        return max(self.min_rounds, min(self.max_rounds, math.ceil(self.samples / max(level, 1))))

    def stream_seconds(self, chunks: int | None = None, delay_ms: float | None = None) -> float:
        """How long the upstream takes to send `chunks` (default `self.chunks`) at `delay_ms` apart."""
        return (chunks or self.chunks) * (self.delay_ms if delay_ms is None else delay_ms) / 1000.0

    def turn_timeout(self, chunks: int | None = None, delay_ms: float | None = None) -> float:
        """Generous: a turn that takes this long has failed, and the run goes on without it."""
        return 30.0 + 5.0 * self.stream_seconds(chunks, delay_ms)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


SMOKE = Config(
    smoke=True,
    compaction_turns=20,
    compaction_repeats=1,
    levels=(1, 3),
    chunks=10,
    delay_ms=5.0,
    samples=1,
    min_rounds=1,
    max_rounds=1,
    ramp_s=0.05,
    stop_sessions=4,
    stop_chunks=40,
    stop_rounds=1,
    stop_after_s=0.02,
    burst_sessions=4,
    burst_rounds=1,
    demo_levels=(2,),
    demo_delay=0.002,
    cold_starts=1,
    idle_s=0.2,
    messages=300,
    events=300,
    page_calls=3,
    replays=1,
    idle_streams=20,
    retained_sessions=10,
    tool_calls=10,
    replica_start=2,
    replica_step=2,
    replica_searches=2,
    replica_rounds=1,
    # Turns of 10 chunks at 5 ms are mostly overhead (a busy CI machine makes them 2-6 times the
    # upstream's): the smoke checks that the search runs, which any limit they could miss would not.
    replica_ratio_limit=100.0,
    replica_delivery_sessions=2,
    replica_cancel_sessions=4,
)


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(",") if part.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"want positive integers separated by commas, got {text!r}")
    return values


def _names(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in text.split(",") if part.strip())
        unknown = sorted(set(names) - set(allowed))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {', '.join(allowed)}")
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark Parley against a fake OpenAI-compatible upstream (see bench/README.md).",
    )
    p.add_argument("--smoke", action="store_true", help="every stage, tiny sizes (CI): no figure is valid")
    p.add_argument("--out", help="results (default bench/results; bench/work/smoke with --smoke)")
    p.add_argument("--work", help="logs and databases (default bench/work)")
    p.add_argument("--levels", type=_ints, help="concurrency levels of the sweep, e.g. 1,10,50,100")
    p.add_argument("--chunks", type=int, help="text chunks per upstream response")
    p.add_argument("--delay-ms", type=float, help="milliseconds between upstream chunks")
    p.add_argument("--samples", type=int, help="turns wanted per level (rounds are clamped)")
    p.add_argument("--max-rounds", type=int, help="most turns per session per level")
    p.add_argument(
        "--adapters", type=_names(ADAPTERS), help="stream adapters to sweep: auto,litellm,anthropic"
    )
    p.add_argument("--stop-sessions", type=int, help="active sessions in the stop stage")
    p.add_argument("--burst-sessions", type=int, help="turns posted at the same moment in the burst stage")
    p.add_argument("--burst-rounds", type=int, help="rounds of the burst stage (raw, then server)")
    p.add_argument("--demo-levels", type=_ints, help="concurrent demo-model sessions, e.g. 50,200")
    p.add_argument("--cold-starts", type=int, help="server spawns timed for the cold start")
    p.add_argument("--messages", type=int, help="messages in the seeded long session")
    p.add_argument("--events", type=int, help="events in the seeded replay session")
    p.add_argument("--idle-streams", type=int, help="idle event streams opened at once")
    p.add_argument("--retained-sessions", type=int, help="sessions in each wave of the retained stage")
    p.add_argument("--replica-start", type=int, help="first level of the one-replica capacity search")
    p.add_argument("--replica-step", type=int, help="the capacity search's step (doubled for two replicas)")
    p.add_argument("--replica-searches", type=int, help="most levels of each capacity search")
    p.add_argument("--stalls", type=float, dest="stall_ms", help="sample the loop's stack on stalls over MS")
    p.add_argument("--render-only", action="store_true", help="rewrite latest.md/png from latest.json")
    p.add_argument("--only", type=_names(STAGES), help=f"run only these stages ({', '.join(STAGES)})")
    p.add_argument("--skip", type=_names(STAGES), help="skip these stages")
    return p


def config_from(args: argparse.Namespace) -> Config:
    config = SMOKE if args.smoke else Config()
    # Every option whose destination is a Config field overrides it when given (--levels, --stalls, ...).
    overrides: dict[str, Any] = {
        f.name: getattr(args, f.name)
        for f in fields(Config)
        if f.name != "smoke" and getattr(args, f.name, None) is not None
    }
    stages = args.only or STAGES
    if args.skip:
        stages = tuple(s for s in stages if s not in args.skip)
    overrides["stages"] = stages
    config = replace(config, **overrides)
    if config.min_rounds > config.max_rounds:
        config = replace(config, min_rounds=config.max_rounds)
    return config
