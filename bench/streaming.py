"""The stages that stream through a running server: the concurrency sweep, stop, and the demo model.

Each measurement window covers only the load: sessions are created and their event streams opened
before it starts, and closed after it ends. Sessions post turns back to back (see load.drive), so a
level's C sessions are all streaming for most of the window.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench import summary
from bench.client import HttpConn
from bench.context import Context, say
from bench.load import (
    BENCH_MODEL,
    CancelPlan,
    Content,
    Probe,
    Session,
    Turn,
    bench_model,
    close_sessions,
    drive,
    every_other,
    idle_cpu_rate,
    open_sessions,
)
from bench.procs import ServerProcess
from tests.fakes.directive import bench_content

DEMO_MODEL = "parley/demo"
DEMO_LONG = "[long] Tell me a story."
DEMO_LONG_TOKENS = 400  # the demo's "[long]" answer, for the timeout only
# Trailing work after the last turn_done (litellm's success logging is a task scheduled at a stream's end)
# belongs to the turns: the window stays open this long after it.
TAIL_S = 0.3


async def warm_up(server: ServerProcess, *, demo: bool = False, model: str = BENCH_MODEL) -> None:
    """One short turn, so that first-call costs (lazy imports, client set-up) fall outside every window."""
    sessions = await open_sessions(server.port, 1, DEMO_MODEL if demo else model)
    try:
        session = sessions[0]
        text = "hello" if demo else bench_content("warmup", 20, 1.0)
        turn = await session.turn("warmup", 0, text, 60.0, None)
        if turn.error is not None:
            raise RuntimeError(f"the warm-up turn failed: {turn.error}\n{server.log_tail()}")
    finally:
        await close_sessions(sessions)


async def measure(
    ctx: Context,
    server: ServerProcess,
    sessions: list[Session],
    rounds: int,
    content: Content,
    timeout: float,
    *,
    cancel: CancelPlan | None = None,
    name: str,
) -> tuple[list[Turn], dict[str, Any], dict[str, dict[str, Any]]]:
    """Drives the sessions inside one probe window; returns the turns, the window, the upstream's records."""
    control = HttpConn(server.port)
    try:
        probe = Probe(server, ctx.upstream, control)
        await probe.start()
        turns = await drive(sessions, rounds, ctx.config.ramp_s, content, timeout, cancel)
        await asyncio.sleep(TAIL_S if not ctx.config.smoke else 0.05)
        window = await probe.stop()
    finally:
        await control.close()
    upstream = ctx.upstream.by_tag()
    ctx.dump(name, [t.as_dict() for t in turns])
    return turns, window, upstream


async def sweep(ctx: Context, server: ServerProcess, adapter: str) -> dict[str, Any]:
    """Every level of the sweep on one server: CPU per chunk, duration ratio, first token, lag, commits."""
    config = ctx.config
    idle_rate = await idle_cpu_rate(server, config.idle_s)
    levels = []
    for level in config.levels:
        rounds = config.rounds(level)
        say(f"sweep {adapter}: {level} sessions x {rounds} turns of {config.chunks} chunks")
        sessions = await open_sessions(server.port, level, bench_model(adapter))
        prefix = f"{adapter}-{level}"

        def content(session: Session, round_: int, prefix: str = prefix) -> tuple[str, str]:
            tag = f"{prefix}-{session.index}-{round_}"
            return tag, bench_content(tag, config.chunks, config.delay_ms)

        try:
            turns, window, upstream = await measure(
                ctx, server, sessions, rounds, content, config.turn_timeout(), name=f"turns-sweep-{prefix}"
            )
        finally:
            await close_sessions(sessions)
        figures = summary.streaming(turns, upstream, window, idle_rate)
        levels.append({"concurrency": level, "rounds": rounds, **figures})
        ratio = figures["duration_ratio"]
        say(
            f"  cpu/chunk {figures['cpu_per_chunk_us']} us, ratio p50 {ratio['p50']} p99 {ratio['p99']}, "
            f"lag p99 {window['loop_lag']['p99_ms']:.1f} max {window['loop_lag']['max_ms']:.1f} ms, "
            f"server {window['server_util']:.0%} upstream {window['upstream_util']:.0%} "
            f"client {window['client_util']:.0%} of a core, others on the server's core "
            f"{window['core_others_share'] or 0:.0%}, errors {figures['errors']['count']}"
        )
    return {"adapter": adapter, "idle_cpu_rate": round(idle_rate, 4), "levels": levels}


async def stop(ctx: Context, server: ServerProcess, adapter: str) -> dict[str, Any]:
    """`stop_sessions` sessions stream back to back; the even ones are stopped mid-stream every round."""
    config = ctx.config
    chunks = config.stop_chunks
    jitter = min(1.0, 0.25 * config.stream_seconds(chunks))
    say(f"stop {adapter}: {config.stop_sessions} sessions x {config.stop_rounds} rounds, half stopped")
    sessions = await open_sessions(server.port, config.stop_sessions, bench_model(adapter))

    def content(session: Session, round_: int) -> tuple[str, str]:
        tag = f"stop-{adapter}-{session.index}-{round_}"
        return tag, bench_content(tag, chunks, config.delay_ms)

    try:
        turns, window, upstream = await measure(
            ctx,
            server,
            sessions,
            config.stop_rounds,
            content,
            config.turn_timeout(chunks),
            cancel=every_other(config.stop_after_s, jitter),
            name=f"turns-stop-{adapter}",
        )
    finally:
        await close_sessions(sessions)
    figures = summary.stopping(turns, upstream, window)
    say(
        f"  cancel->agent_cancelled p99 {figures['cancel_to_event_ms']['p99']} ms, "
        f"->upstream disconnect p99 {figures['cancel_to_disconnect_ms']['p99']} ms, "
        f"not seen {figures['disconnect_not_seen']}"
    )
    return {"adapter": adapter, "sessions": config.stop_sessions, "rounds": config.stop_rounds, **figures}


async def demo(ctx: Context, server: ServerProcess) -> dict[str, Any]:
    """The in-process demo model, paced at PARLEY_DEMO_TOKEN_DELAY: CPU per token, time over model time."""
    config = ctx.config
    await warm_up(server, demo=True)
    idle_rate = await idle_cpu_rate(server, config.idle_s)
    timeout = config.turn_timeout(DEMO_LONG_TOKENS, config.demo_delay * 1000.0)
    levels = []
    for level in config.demo_levels:
        say(f"demo: {level} sessions of '[long]' at {config.demo_delay * 1000:g} ms a token")
        sessions = await open_sessions(server.port, level, DEMO_MODEL)

        def content(session: Session, round_: int, level: int = level) -> tuple[str, str]:
            return f"demo-{level}-{session.index}-{round_}", DEMO_LONG

        try:
            turns, window, _ = await measure(
                ctx, server, sessions, 1, content, timeout, name=f"turns-demo-{level}"
            )
        finally:
            await close_sessions(sessions)
        figures = summary.demo(turns, window, config.demo_delay, idle_rate)
        levels.append({"concurrency": level, **figures})
        say(
            f"  cpu/token {figures['cpu_per_token_us']} us, ratio p50 {figures['duration_ratio']['p50']}, "
            f"lag p99 {window['loop_lag']['p99_ms']:.1f} ms"
        )
    return {"token_delay_s": config.demo_delay, "idle_cpu_rate": round(idle_rate, 4), "levels": levels}
