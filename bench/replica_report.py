"""The multi-replica stage's figures (against the issue's targets) and its table in latest.md."""

from __future__ import annotations

from typing import Any

from bench.figure import Figure, get


def _capacity(run: dict[str, Any] | None, which: str) -> str:
    found = get(run, which, "capacity")
    if found is None:
        return "–"
    return f"{found}" if get(run, which, "bounded") else f"at least {found}"


def figures(results: dict[str, Any]) -> list[Figure]:
    run = results.get("replicas")
    one, two = get(run, "one", "capacity"), get(run, "two", "capacity")
    delivery, cancel = get(run, "delivery"), get(run, "cancel")
    return [
        Figure(
            "replicas_capacity_ratio",
            "Two replicas: concurrent streaming sessions over one replica's",
            round(two / one, 2) if one and two is not None else None,
            "×",
            1.8,
            at_least=True,
            note=f"one replica {_capacity(run, 'one')} sessions, two {_capacity(run, 'two')}, each the most "
            f"with turn duration p50 within {get(run, 'ratio_limit')}× the upstream's and no failed turn; "
            f"{get(run, 'note')}",
        ),
        Figure(
            "replicas_delivery_added_p99_ms",
            "Event delivery on another replica than the turn's: added latency, p99",
            get(delivery, "added_ms", "p99"),
            "ms",
            25,
            note=f"the same event read on the turn's replica and on the other; p50 "
            f"{get(delivery, 'added_ms', 'p50')} ms, n={get(delivery, 'events')} events of "
            f"{get(delivery, 'sessions')} sessions, missing on the other replica: {get(delivery, 'missing')}",
        ),
        Figure(
            "replicas_cancel_disconnect_p99_ms",
            "Cancel on another replica → upstream sees the disconnect, p99",
            get(cancel, "cancel_to_disconnect_ms", "p99"),
            "ms",
            100,
            note=f"{get(cancel, 'sessions')} sessions streaming, "
            f"n={get(cancel, 'cancel_to_disconnect_ms', 'n')}; "
            f"p50 {get(cancel, 'cancel_to_disconnect_ms', 'p50')} ms; cancel → agent_cancelled p99 "
            f"{get(cancel, 'cancel_to_event_ms', 'p99')} ms; disconnects not seen: "
            f"{get(cancel, 'disconnect_not_seen')}",
        ),
    ]


def turn_errors(results: dict[str, Any]) -> int:
    """Failed turns of the delivery and cancel runs. The capacity levels' are not counted: a level that
    overloads the replicas until turns fail is how the search finds the limit."""
    run = results.get("replicas") or {}
    return sum(int(get(run, part, "errors", "count") or 0) for part in ("delivery", "cancel"))


# Where a turn's time beyond the upstream's goes: what the ratio's excess is made of.
_PHASES = ("post_to_accepted_ms", "post_to_request_ms", "first_text_added_ms", "end_to_done_ms")


def _phases(level: dict[str, Any]) -> str:
    """The p50 of each phase (– where a run's results predate the figure)."""
    values = [(level.get(key) or {}).get("p50") for key in _PHASES]
    return " / ".join("–" if value is None else f"{value:.0f}" for value in values)


def markdown(run: dict[str, Any]) -> str:
    """Every level of both capacity searches, with where the machine's time went."""
    rows = [
        "| replicas | sessions | turns | ratio p50 | ratio p99 | errors | CPU/chunk µs | replicas' CPU "
        "| loop lag p99 ms | cores busy | upstream / client / Redis / PostgreSQL CPU "
        "| post → 202 / → upstream / first token added / end → turn_done, p50 ms | within |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for which in ("one", "two"):
        for level in get(run, which, "levels") or []:
            window = level["window"]
            utils = " / ".join(f"{r['util']:.0%}" for r in window["replicas"])
            lags = " / ".join(f"{r['loop_lag']['p99_ms']:.1f}" for r in window["replicas"])
            cores = " / ".join(f"{share:.0%}" for share in window["core_busy_share"].values())
            engines = " / ".join(
                "–" if window.get(key) is None else f"{window[key]:.0%}"
                for key in ("redis_util", "postgres_util")
            )
            rows.append(
                f"| {level['replicas']} | {level['concurrency']} | {level['turns']} | "
                f"{level['duration_ratio']['p50']} | {level['duration_ratio']['p99']} | "
                f"{level['errors']['count']} | {level['cpu_per_chunk_us']} | {utils} | {lags} | {cores} | "
                f"{window['upstream_util']:.0%} / {window['client_util']:.0%} / "
                f"{engines} | {_phases(level)} | {'✅' if level['passed'] else '❌'} |"
            )
    return "\n".join([f"{run.get('note', '')}.", "", *rows])
