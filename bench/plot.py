"""latest.png: the turn duration ratio (p50, p99) and the event-loop lag (p99, max) against concurrency,
for the server with each adapter and for the raw SDKs reading the same upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: CI and servers

import matplotlib.pyplot as plt  # after use(): the backend must be chosen first


def _series(results: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]], str, str]]:
    """(label, levels, colour, path to the window inside a level)."""
    found = []
    colours = {"auto": "tab:blue", "litellm": "tab:orange"}
    for adapter, sweep in (results.get("sweep") or {}).items():
        label = "server (default adapter)" if adapter == "auto" else f"server ({adapter} adapter)"
        found.append((label, sweep["levels"], colours.get(adapter, "tab:purple"), "window"))
    for sdk, colour in (("litellm", "tab:gray"), ("openai", "tab:green")):
        levels = ((results.get("baselines") or {}).get(sdk) or {}).get("levels")
        if levels:
            found.append((f"raw {sdk}", levels, colour, "window"))
    return found


def plot(results: dict[str, Any], path: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    ticks: set[int] = set()
    highest = 0.0
    for label, levels, colour, window in _series(results):
        ticks.update(level["concurrency"] for level in levels)
        x = [level["concurrency"] for level in levels]
        left.plot(
            x, [level["duration_ratio"]["p50"] for level in levels], "o-", color=colour, label=f"{label} p50"
        )
        left.plot(
            x, [level["duration_ratio"]["p99"] for level in levels], "s--", color=colour, label=f"{label} p99"
        )
        lags = [level[window]["loop_lag"] for level in levels]
        right.plot(x, [lag["p99_ms"] for lag in lags], "o-", color=colour, label=f"{label} p99")
        right.plot(x, [lag["max_ms"] for lag in lags], "s--", color=colour, label=f"{label} max")
        highest = max([highest, *(lag["max_ms"] or 0.0 for lag in lags)])
    for axis, targets in ((left, (1.10, 1.25)), (right, (20.0, 50.0))):
        for target in targets:
            axis.axhline(target, color="red", linewidth=0.8, linestyle=":")
        axis.set_xscale("log")
        axis.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        axis.minorticks_off()
        axis.set_xlabel("concurrent sessions")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    left.set_title("Turn duration / upstream's own duration")
    left.set_ylabel("ratio (red: targets 1.10 p50, 1.25 p99)")
    right.set_title("Event-loop lag (10 ms ticker)")
    right.set_ylabel("ms (red: targets 20 p99, 50 max)")
    if highest > 200:  # one long stall would flatten every other line
        right.set_yscale("symlog", linthresh=10)
    right.set_ylim(bottom=0)
    chunks, delay = results["config"]["chunks"], results["config"]["delay_ms"]
    figure.suptitle(f"Parley, {chunks} chunks at {delay:g} ms, real HTTP to a fake upstream", fontsize=10)
    temporary = path.with_name(path.name + ".tmp")
    figure.savefig(temporary, dpi=110, format="png")
    plt.close(figure)
    temporary.replace(path)
