"""The first token's own cost, in one process: a response's first delta through the write-behind on SQLite.

What the server does when a response's first text arrives (turns.recorder): the message's row is built,
its first `text_delta` published, the buffer tracked, and the urgent commit made at once (`opened`: the
row and the event in one transaction, then the delivery). Timed here with nothing else running, as the
sweep's first-token figure cannot be on this shared VM (its noise is larger than such a change): the CPU
and wall time of those steps, per first delta, over `--n` responses of 50 sessions, while 250 deltas of
50 other sessions wait for their interval batch (the pending work a server at 50 streaming sessions
holds). Each response is then ended by a turn write, untimed, so the writer holds one open text per
session, as a server does.

    .venv/bin/python -m bench.first_delta                       # this checkout
    cd ../other && PYTHONPATH=. ../main/.venv/bin/python ../main/bench/first_delta.py   # another one

Run each checkout alternately, a few times: the figures move with the machine, not only with the code.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from app.protocol.events import TextDelta
from app.protocol.ids import new_message_id
from app.storage.engine import Database
from app.storage.tables import new_message
from app.streaming.frames import Publisher
from app.streaming.log.texts import TextBuffer
from app.streaming.log.write_behind import WriteBehind
from tests.support.rows import add_sessions
from tests.support.server import migrate

SESSIONS = 50
PENDING = 250
AT = "2026-11-24T00:00:00.000Z"
# Before 531feef a first delta went through its event model: older checkouts are timed as they were.
_BY_HAND = "timestamp" in inspect.signature(Publisher.text_delta).parameters


def _first_delta(publisher: Publisher, buffer: TextBuffer) -> None:
    if _BY_HAND:
        publisher.text_delta(buffer.message_id, "Hello", timestamp=AT, model="demo")
    else:
        publisher.emit(TextDelta, id=buffer.message_id, text="Hello", timestamp=AT, model="demo")


async def measure(n: int, directory: Path) -> dict[str, Any]:
    url = f"sqlite+aiosqlite:///{directory / 'first-delta.db'}"
    migrate(url)
    database = Database(url)
    sessions = [f"s_bench{i:04d}" for i in range(SESSIONS)]
    await add_sessions(database, *sessions)
    delivered: list[Any] = []
    writer = WriteBehind(database, interval=3600.0, deliver=delivered.extend)
    publishers = {sid: writer.publisher(sid) for sid in sessions}
    cpu = wall = 0.0
    try:
        for sid in sessions:  # each session's last number known, as in a running server
            async with writer.transaction(sid):
                pass
        for i in range(PENDING):  # other sessions' deltas, waiting for the interval batch
            writer.publisher(f"s_other{i % SESSIONS:04d}").text_delta("m_other", "word")
        for i in range(n + SESSIONS):
            sid = sessions[i % SESSIONS]
            c0, w0 = time.process_time(), time.perf_counter()
            row = new_message(
                id=new_message_id(),
                session_id=sid,
                turn_id="t_bench",
                type="text",
                timestamp=AT,
                role="assistant",
                content="Hello",
                model="demo",
                response_id="r_bench",
            )
            buffer = TextBuffer(row)
            _first_delta(publishers[sid], buffer)
            writer.track(buffer)
            await writer.opened(sid)
            if i >= SESSIONS:  # the first round warms up
                cpu += time.process_time() - c0
                wall += time.perf_counter() - w0
            async with writer.transaction(sid):  # the response ends (untimed)
                writer.untrack(buffer)
    finally:
        await database.dispose()
    return {
        "first_deltas": n,
        "cpu_us": round(cpu / n * 1e6, 1),
        "wall_us": round(wall / n * 1e6, 1),
        "urgent_commits": writer.urgent_commits,
        "delivered": len(delivered),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.first_delta", description="The first token's own cost, in one process."
    )
    parser.add_argument("--n", type=int, default=3000, help="first deltas timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="parley-first-delta-") as directory:
        found = asyncio.run(measure(args.n, Path(directory)))
    print(
        f"first delta: {found['cpu_us']} us CPU, {found['wall_us']} us wall, over {found['first_deltas']} "
        f"({found['urgent_commits']} urgent commits)"
    )


if __name__ == "__main__":
    main()
