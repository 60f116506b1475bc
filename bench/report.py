"""latest.json and latest.md: the figures against their targets, the machine, and the per-level tables."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.figure import Figure, get
from bench.procs import ROOT, Cores
from bench.replica_report import markdown as replicas_markdown
from bench.tools import markdown as tools_markdown


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    """Read-only git queries (the commit measured, and whether the tree had changes on top of it)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _adapter_knob() -> bool:
    """Whether this server knows PARLEY_STREAM_ADAPTER (without it the two sweeps run the same adapter)."""
    from app.settings import Settings

    return "stream_adapter" in Settings.model_fields


def machine(cores: Cores) -> dict[str, Any]:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "pinning": cores.describe(),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "litellm": _version("litellm"),
        "openai": _version("openai"),
        "uvicorn": _version("uvicorn"),
        "uvloop": _version("uvloop"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "stream_adapter_knob": _adapter_knob(),
        "load_average_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and unit == "×":
        text = f"{value:.3f}".rstrip("0").rstrip(".")  # 1.104 must not read as the 1.10 it fails
    elif isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 10 else f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip() if unit and unit != "×" else f"{text}{unit}"


def _pass(figure: Figure) -> str:
    return {True: "✅", False: "❌", None: "–"}[figure.passed]


def _others(figure: Figure) -> tuple[str, str]:
    labels, ratios = [], []
    for label, value in {**figure.baselines, **figure.peers}.items():
        if value is None:
            continue
        labels.append(f"{label} {_fmt(value, figure.unit)}")
        if figure.value is not None and value:
            ratios.append(f"{figure.value / value:.2f}×")
    return "; ".join(labels) or "–", " / ".join(ratios) or "–"


def _figure_rows(figures: list[Figure]) -> list[str]:
    rows = ["| figure | ours | target | baseline / peer | ratio | pass |", "|---|---|---|---|---|---|"]
    for figure in figures:
        others, ratios = _others(figure)
        bound = "≥" if figure.at_least else "≤"
        target = f"{bound} {_fmt(figure.target, figure.unit)}" if figure.target is not None else "–"
        note = f"<br><sub>{figure.note}</sub>" if figure.note else ""
        rows.append(
            f"| {figure.name}{note} | {_fmt(figure.value, figure.unit)} | {target} | {others} | {ratios} | "
            f"{_pass(figure)} |"
        )
    return rows


def _sweep_rows(results: dict[str, Any]) -> list[str]:
    rows = [
        "| run | sessions | turns | CPU/chunk µs | ratio p50 | ratio p99 | first text p50 ms | lag p99 ms "
        "| lag max ms | batch commits /100 ms | server / upstream / client CPU | others on its core |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for adapter, sweep in (results.get("sweep") or {}).items():
        for level in sweep["levels"]:
            window = level["window"]
            batch = (window["commits"].get("max_per_window_by_origin") or {}).get("batch", 0)
            rows.append(
                f"| server, {adapter} adapter | {level['concurrency']} | {level['turns']} | "
                f"{_fmt(level['cpu_per_chunk_us'])} | {_fmt(level['duration_ratio']['p50'])} | "
                f"{_fmt(level['duration_ratio']['p99'])} | {_fmt(level['first_text_ms']['p50'])} | "
                f"{_fmt(window['loop_lag']['p99_ms'])} | {_fmt(window['loop_lag']['max_ms'])} | {batch} | "
                f"{window['server_util']:.0%} / {window['upstream_util']:.0%} / {window['client_util']:.0%} "
                f"| {window.get('core_others_share') or 0:.0%} |"
            )
    for sdk, baseline in (results.get("baselines") or {}).items():
        for level in baseline["levels"]:
            lag = level["window"]["loop_lag"]
            ratio, cpu = level["duration_ratio"], _fmt(level["cpu_per_chunk_us"])
            rows.append(
                f"| raw {sdk} | {level['concurrency']} | {level['turns']} | {cpu} "
                f"| {_fmt(ratio['p50'])} | {_fmt(ratio['p99'])} | {_fmt(level['first_text_ms']['p50'])} "
                f"| {_fmt(lag['p99_ms'])} | {_fmt(lag['max_ms'])} | – | {level['window']['util']:.0%} "
                f"| {level['window'].get('others_share') or 0:.0%} |"
            )
    return rows


def _stall_rows(results: dict[str, Any]) -> list[str]:
    """With --stalls: where the server's loop was when it stalled, per sweep level."""
    rows: list[str] = []
    for adapter, sweep in (results.get("sweep") or {}).items():
        for level in sweep["levels"]:
            stalls = level["window"].get("stalls")
            if not stalls or not stalls["top"]:
                continue
            rows += [
                "",
                f"**{adapter} adapter, {level['concurrency']} sessions** ({stalls['samples']} stalls):",
                "",
            ]
            rows += [f"- {entry['count']} × `{entry['stack']}`" for entry in stalls["top"][:5]]
    if rows:
        threshold = results["config"].get("stall_ms")
        rows = ["", f"## Where the loop stalled over {threshold:g} ms (innermost frame first)", *rows]
    return rows


def markdown(results: dict[str, Any], figures: list[Figure]) -> str:
    info = results["machine"]
    config = results["config"]
    smoke = " (SMOKE: tiny sizes, the figures mean nothing)" if config["smoke"] else ""
    knob = (
        ""
        if info["stream_adapter_knob"]
        else (" This server does not know PARLEY_STREAM_ADAPTER yet: both sweeps ran its one adapter.")
    )
    commit = (info["git_commit"] or "?")[:12] + (" with local changes" if info["git_dirty"] else "")
    lines = [
        f"# Parley benchmark{smoke}",
        "",
        f"{info['date']}, commit `{commit}`, {info['cores']} cores ({info['cpu_model']}), "
        f"Python {info['python']}, litellm {info['litellm']}, openai {info['openai']}. {info['pinning']}. "
        f"Load average at start {info['load_average_start']}, at end {info.get('load_average_end')}. "
        f"Upstream: {config['chunks']} chunks at {config['delay_ms']:g} ms.{knob} "
        f"Run time {results.get('run_seconds')} s.",
        "",
        "## Targets",
        "",
        *_figure_rows([f for f in figures if f.group == "server"]),
        "",
        "## Was the measurement sound?",
        "",
        *_figure_rows([f for f in figures if f.group == "harness"]),
        "",
        "## Concurrency sweep",
        "",
        *_sweep_rows(results),
        "",
        "![duration ratio and loop lag against concurrency](latest.png)",
        "",
        "What each figure measures, exactly: [bench/README.md](../README.md). Every number with its raw "
        "distribution (n, p50, p99, max) is in [latest.json](latest.json).",
    ]
    lines += _stall_rows(results)
    if get(results, "tools", "kinds"):
        lines += ["", "## Tool calls", "", tools_markdown(results["tools"])]
    if get(results, "replicas", "one", "levels"):
        lines += [
            "",
            "## Several replicas: the capacity searches",
            "",
            replicas_markdown(results["replicas"]),
        ]
    if results.get("errors"):
        lines += ["", "## Stage errors", ""]
        lines += [f"- {e['stage']}: `{e['error'][:300]}`" for e in results["errors"]]
    return "\n".join(lines) + "\n"


def write(out: Path, results: dict[str, Any], figures: list[Figure]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {**results, "figures": [figure.as_dict() for figure in figures]}
    _atomic(out / "latest.json", json.dumps(document, indent=1, default=str) + "\n")
    _atomic(out / "latest.md", markdown(results, figures))


def _atomic(path: Path, text: str) -> None:
    """Through a .tmp file (ignored by git): an interrupted run never leaves half a report."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
