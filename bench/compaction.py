"""`python -m bench.compaction` (and the `compaction` stage of `make bench`): the CPU the service spends
deciding what a model call sends (docs/context.md), and how often compaction adds a summary call.

A session of `turns` turns on a model with an `window`-token window (every third turn a tool round whose
result is 2,000 characters, the others a 300-character question; answers of 400 characters) is planned
turn after turn as a turn does it: `Compactor.view` over the whole history, its summaries written by an
in-process summariser that answers at once, so that only the planning is timed (process CPU time,
`time.process_time`). Figures: the planning's CPU per turn at the last turn (p50 over `repeats` runs, the
target is under 5 ms), its p99 over every turn, and turns per summary call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncGenerator
from typing import Any

from app.llm.types import ModelRequest, ResolvedModel, StreamPart, TextPart
from app.turns.context.compactor import Compactor, ContextCompacted, SummaryModel
from app.turns.context.planner import Policy
from bench.figure import Figure, get

WINDOW = 8_000
TARGET_MS = 5.0


class _Summariser:
    """Answers a summary request at once, with a summary of a realistic length."""

    async def _parts(self) -> AsyncGenerator[StreamPart, None]:
        yield TextPart("- The user asked about the project's pages; the assistant read them. " * 8)

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        return self._parts()


def _turn(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Question {n}: " + "tell me more " * 23}]
    if n % 3 == 0:
        function = {"name": "fetch", "arguments": '{"page": 1}'}
        call = {"id": f"call_{n}", "type": "function", "function": function}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": "page text " * 200},
        ]
    messages.append({"role": "assistant", "content": f"Answer {n}: " + "here is what I found " * 19})
    return messages


async def _session(turns: int, window: int) -> tuple[list[float], int]:
    model = ResolvedModel("bench/planner", context_window=window)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    owners: list[tuple[str, ...]] = [()]
    summariser = SummaryModel(_Summariser(), model)
    summary = None
    cpu: list[float] = []
    written = 0
    for n in range(turns):
        turn = _turn(n)
        messages.append(turn[0])
        owners.append((f"t_{n}",))
        started = time.process_time()
        # One compactor a turn, as the service builds it (turns.execution), with the summary in force.
        compactor = Compactor(Policy(), window, owners, summariser, summary=summary, scale=1.1)
        async for item in compactor.view(messages, overhead=200):
            if isinstance(item, ContextCompacted) and item.written:
                written += 1
        cpu.append((time.process_time() - started) * 1000)
        summary = compactor.summary
        messages.extend(turn[1:])
        owners.extend([(f"t_{n}",)] * (len(turn) - 1))
    return cpu, written


def measure(turns: int = 200, repeats: int = 5, window: int = WINDOW) -> dict[str, Any]:
    runs = [asyncio.run(_session(turns, window)) for _ in range(repeats)]
    last = [cpu[-1] for cpu, _ in runs]
    every = sorted(ms for cpu, _ in runs for ms in cpu)
    written = runs[0][1]
    return {
        "turns": turns,
        "window": window,
        "repeats": repeats,
        "last_turn_cpu_ms_p50": round(statistics.median(last), 3),
        "turn_cpu_ms_p99": round(every[min(len(every) - 1, int(len(every) * 0.99))], 3),
        "summaries": written,
        "turns_per_summary": round(turns / written, 1) if written else None,
    }


def figures(results: dict[str, Any]) -> list[Figure]:
    """The issue's target: deciding what to send costs under 5 ms of CPU a turn at 200 turns."""
    found = results.get("compaction") or {}
    return [
        Figure(
            "compaction_planner_cpu_ms",
            f"Deciding what a model call sends, CPU per turn at turn {get(found, 'turns')}",
            get(found, "last_turn_cpu_ms_p50"),
            "ms",
            TARGET_MS,
            note=f"{get(found, 'window')}-token window; p99 over every turn {get(found, 'turn_cpu_ms_p99')} "
            f"ms; one summary call every {get(found, 'turns_per_summary')} turns",
        )
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=int, default=WINDOW)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.turns, args.repeats, args.window), indent=2))


if __name__ == "__main__":
    main()
