"""Two commits side by side: the same stages run alternately for each, in one session of runs.

This VM's speed changes from one hour (and one host) to the next by up to 2×, so figures from two runs an
hour apart say little about a change. Alternating runs of each revision, round after round, share the
machine's state; the spread across rounds says what the noise is.

    .venv/bin/python -m bench.compare bbd79b3 HEAD       # sweep at 10 and 50 sessions, 3 rounds
    .venv/bin/python -m bench.compare HEAD . --rounds 2  # `.`: this checkout, uncommitted changes too
    .venv/bin/python -m bench.compare A B -- --only demo # after `--`: bench.run's own options

A revision other than `.` runs from a detached git worktree under bench/work/compare/ (removed at the end),
with this checkout's .venv. Each run writes its results to bench/work/compare/<name>-<round>/. Printed at
the end: per revision and round, for each sweep level, the latency added to the first token (p50), the CPU
per chunk and the raw openai SDK's first token in the same run; and for the demo stage, the CPU per token.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "compare"
DEFAULT_RUN = ["--only", "baselines,sweep", "--levels", "10,50", "--adapters", "auto"]


@dataclass(frozen=True)
class Revision:
    name: str  # as given
    directory: Path
    worktree: bool  # made here, removed at the end


def checkout(rev: str) -> Revision:
    if rev == ".":
        return Revision(rev, ROOT, worktree=False)
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    directory = WORK / f"tree-{commit[:12]}"
    if directory.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(directory)], cwd=ROOT, check=False)
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(directory), commit], cwd=ROOT, check=True)
    (directory / ".venv").symlink_to(ROOT / ".venv")
    return Revision(rev, directory, worktree=True)


def remove(revision: Revision) -> None:
    if revision.worktree:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(revision.directory)], cwd=ROOT, check=False
        )


def label(rev: str) -> str:
    return "this-checkout" if rev == "." else rev.replace("/", "_").replace("~", "-").replace("^", "-")


def run_once(revision: Revision, out: Path, run_args: list[str]) -> dict[str, Any]:
    """One `bench.run` of the revision, from its own directory; its latest.json."""
    if out.exists():
        shutil.rmtree(out)
    command = [str(ROOT / ".venv" / "bin" / "python"), "-m", "bench.run", *run_args]
    command += ["--out", str(out), "--work", str(out / "work")]
    subprocess.run(command, cwd=revision.directory, check=False, stdout=subprocess.DEVNULL)
    results: dict[str, Any] = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    return results


def _p50(level: dict[str, Any], key: str) -> Any:
    return (level.get(key) or {}).get("p50")


def rows(name: str, round_: int, results: dict[str, Any]) -> list[str]:
    """Markdown rows of one run: the sweep's levels (default adapter) and the demo's."""
    out = []
    openai = {
        lv.get("concurrency"): lv for lv in results.get("baselines", {}).get("openai", {}).get("levels", [])
    }
    for level in results.get("sweep", {}).get("auto", {}).get("levels", []):
        sessions = level.get("concurrency")
        raw = _p50(openai.get(sessions, {}), "first_text_added_ms")
        added = _p50(level, "first_text_added_ms")
        cpu = level.get("cpu_per_chunk_us")
        out.append(f"| {name} | {round_} | sweep {sessions} | {added} ms | {raw} ms | {cpu} µs/chunk |")
    for level in results.get("demo", {}).get("levels", []):
        cpu = level.get("cpu_per_token_us")
        out.append(f"| {name} | {round_} | demo {level.get('concurrency')} | – | – | {cpu} µs/token |")
    errors = results.get("errors") or []
    if errors:
        out.append(f"| {name} | {round_} | errors | {len(errors)}: {errors[0].get('stage')} | | |")
    return out


HEADER = [
    "| revision | round | stage, sessions | first token added p50 | raw openai's | CPU |",
    "|---|---|---|---|---|---|",
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "revisions", nargs="+", help="commits (anything git rev-parse takes), or . for this checkout"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.epilog = "Options after -- go to bench.run (default: " + " ".join(DEFAULT_RUN) + ")."
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    run_args = DEFAULT_RUN
    if "--" in argv:
        run_args, argv = argv[argv.index("--") + 1 :], argv[: argv.index("--")]
    args = parser().parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    revisions = [checkout(rev) for rev in args.revisions]
    table = list(HEADER)
    try:
        for round_ in range(1, args.rounds + 1):
            for revision in revisions:
                results = run_once(revision, WORK / f"{label(revision.name)}-{round_}", run_args)
                new = rows(revision.name, round_, results)
                print("\n".join(new), flush=True)
                table += new
    finally:
        for revision in revisions:
            remove(revision)
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
