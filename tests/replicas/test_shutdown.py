"""SIGTERM of one replica of two (issue 16, test 8: a rolling deploy's step), with a turn running on each
and streams open on both: the stopped replica's turn ends with its partial state committed, its streams
end and their clients resume on the other replica from Last-Event-ID with nothing missing or twice, it
exits promptly, and the other replica's turn and streams go on untouched.

Everything is compared with the event log and the history rows the replicas share (tests/replicas)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.replicas.conftest import Replicas, clients, rows, until
from tests.replicas.test_ownership import history, new_session, post, running_leases, streaming_started
from tests.support.postgres import ScratchDatabase
from tests.support.stream import Frame, StreamClient, assert_contiguous

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# uvicorn re-raises the signal once it has shut down, so the exit status is -SIGTERM.
CLEAN_EXITS = {0, -15}
# PARLEY_SHUTDOWN_TIMEOUT's 5 s for the turns, the flush and the exit, with room for a busy machine.
PROMPT_EXIT_SECONDS = 15


def logged(pg: ScratchDatabase, sid: str) -> list[tuple[int, str, str]]:
    found = rows(pg, "SELECT seq, type, data FROM events WHERE session_id = %s ORDER BY seq", sid)
    return [(int(seq), str(type_), str(data)) for seq, type_, data in found]


def as_logged(frames: list[Frame]) -> list[tuple[int, str, str]]:
    return [(f.id, f.event, f.data) for f in frames]


def turn_done(stream: StreamClient, turn_id: str) -> bool:
    return any(f.event == "turn_done" and f.payload.get("turn_id") == turn_id for f in stream.frames)


async def test_sigterm_of_one_replica_stops_its_turn_and_streams_and_leaves_the_other_alone(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream
) -> None:
    a_server, b_server = await replicas(2)
    # A's turn (30 s of words), then B's (about 6 s), then the stopped session's next message on B.
    upstream.enqueue(Script.words(3000, delay=0.01), Script.words(600, delay=0.01), Script.text("Go on."))
    async with clients(a_server, b_server) as (a, b):
        on_a, on_b = await new_session(a), await new_session(b)
        hopping, staying, other = StreamClient(a, on_a), StreamClient(b, on_a), StreamClient(b, on_b)
        opened = [asyncio.Event() for _ in range(3)]
        hop = asyncio.create_task(hopping.read(seconds=90, opened=opened[0]))
        stay = asyncio.create_task(staying.read(seconds=90, opened=opened[1]))
        for event in opened[:2]:
            await event.wait()
        stopped_turn = (await post(a, on_a, "tell me a long story"))["turn_id"]
        await until(lambda: streaming_started(pg, stopped_turn))
        other_turn = (await post(b, on_b, "and you, a shorter one"))["turn_id"]
        assert stopped_turn is not None and other_turn is not None
        watch = asyncio.create_task(
            other.read(lambda _: turn_done(other, other_turn), seconds=90, opened=opened[2])
        )
        await opened[2].wait()
        await until(lambda: streaming_started(pg, other_turn))
        await hopping.wait(lambda frames: sum(f.event == "text_delta" for f in frames) >= 20)
        # A message posted meanwhile waits in the stopped session's line.
        waiting = await post(b, on_a, "and after that?")
        assert waiting["queued"] is True

        seconds = await asyncio.to_thread(a_server.terminate)
        assert await hop in ("ended", "broken")  # A ended its stream as it stopped
        hopping.client = b  # its client's normal reconnect, with Last-Event-ID, to the replica left
        # It gets the rest of the stopped turn (if A's end cut any) and the next turn, run on B.
        assert await hopping.read(hopping.turns_done(2), seconds=60) == "matched"
        # B's turn and streams are untouched: its turn completes, watched from B all along.
        assert await watch == "matched"
        # The stopped session takes its waiting message on B (B's sweeper finds nobody took it).
        await until(lambda: _answered(pg, waiting["id"]), seconds=30)
        await staying.wait(lambda _: staying.types().count("turn_done") >= 2, seconds=30)
        stay.cancel()
        await asyncio.gather(stay, return_exceptions=True)

    assert a_server.returncode in CLEAN_EXITS, a_server.log()[-3000:]
    assert seconds < PROMPT_EXIT_SECONDS
    assert "Traceback" not in a_server.log() and "Traceback" not in b_server.log()
    # A's turn: stopped with its partial text kept and marked, turn_done interrupted; no lease left.
    stopped = [m for m in history(pg, on_a) if m["turn_id"] == stopped_turn]
    assert [m["status"] for m in stopped if m["type"] == "turn_done"] == ["interrupted"]
    cut = [m for m in stopped if m["type"] == "text" and m["role"] == "assistant"]
    assert len(cut) == 1 and cut[0]["interrupted"] and cut[0]["content"]
    assert running_leases(pg, on_a) == running_leases(pg, on_b) == 0
    assert _turn_status(pg, other_turn) == "completed"
    # Every stream: the log's frames, contiguous, nothing twice (the hop from A to B included).
    for stream, sid in ((hopping, on_a), (staying, on_a), (other, on_b)):
        assert_contiguous(stream.frames, first=stream.frames[0].id)
        assert as_logged(stream.frames) == logged(pg, sid)[stream.frames[0].id - 1 : stream.frames[-1].id]
    assert hopping.connects == 2 and staying.connects == 1 and other.connects == 1


def _turn_status(pg: ScratchDatabase, turn_id: str) -> str | None:
    found = rows(pg, "SELECT status FROM chat_messages WHERE turn_id = %s AND type = 'turn_done'", turn_id)
    return str(found[0][0]) if found else None


async def _answered(pg: ScratchDatabase, message_id: str) -> bool:
    found = rows(pg, "SELECT turn_id FROM chat_messages WHERE id = %s", message_id)
    return bool(found) and found[0][0] is not None and _turn_status(pg, str(found[0][0])) == "completed"
