"""A replica paused while it holds locks on its leases' rows (issue 31 §3): a GC stall, a frozen VM or a
partition in the middle of a write-behind batch, whose fence check keeps those rows locked to its commit.

How each test proves its point: the owner freezes itself (SIGSTOP) right after a batch's check locked
the rows of its streaming turns (tests.support.batch_pause_app), and PostgreSQL shows its connection
idle in a transaction holding a lock on turn_leases: the state the trials caught by chance. From that
moment the survivor must close every streaming turn and take over the one waiting for a client tool
(whose row the batch did not lock) within a lease, a sweep and a margin, read from the shared database; a
cancel posted to the survivor must be answered (202, the turn cancelled) within a lease and two
heartbeats; and once the owner runs again it writes nothing: the database is what the survivor left.
Before the fix the survivor's takeover waited 30 s on the lock and the cancel answered 503.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.session import assert_strictly_valid
from tests.replicas.conftest import LEASE_SECONDS, Replicas, clients, rows, until
from tests.replicas.test_handover import answered_on, owner_of
from tests.replicas.test_ownership import new_session, post, snapshot, streaming_started, turn_status
from tests.support.postgres import ScratchDatabase
from tests.support.process import ServerProcess
from tests.tool_requests.helpers import LOCATION, calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PAUSE_APP = "tests.support.batch_pause_app:app"
HEARTBEAT = LEASE_SECONDS / 3
# Time on top of the promise for the survivor's own work on a busy 2-core machine.
MARGIN = 3.0
STREAMING = 3

# Connections of this database idle inside a transaction that holds a lock on turn_leases.
LOCK_HOLDERS = (
    "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
    " WHERE l.relation = 'turn_leases'::regclass AND l.granted AND a.state = 'idle in transaction'"
    " AND a.datname = current_database()"
)


async def _stopped(server: ServerProcess) -> bool:
    return server.stopped()


async def _waiting(pg: ScratchDatabase, turn_id: str) -> bool:
    found = rows(
        pg, "SELECT count(*) FROM pending_tool_requests WHERE turn_id = %s AND state = 'pending'", turn_id
    )
    return int(found[0][0]) == 1


async def test_a_replica_paused_holding_its_lease_locks_loses_every_turn_within_a_lease_and_a_sweep(
    replicas: Replicas, pg: ScratchDatabase, upstream: FakeUpstream, tmp_path: Path
) -> None:
    trigger = tmp_path / "pause-in-batch"
    owner, survivor = await replicas(2, app=PAUSE_APP, PAUSE_IN_BATCH_FILE=str(trigger))
    loop = asyncio.get_running_loop()
    async with clients(owner, survivor) as (a, b):
        upstream.enqueue(calls(("call_loc", "get_location", '{"precise": true}'), text="Let me look."))
        waiting_sid = await new_session(a, client_tools=[LOCATION])
        waiting_turn = (await post(a, waiting_sid, "where am I?"))["turn_id"]
        await until(lambda: _waiting(pg, waiting_turn), seconds=60)
        first_owner = owner_of(pg, waiting_turn)
        upstream.enqueue(*(Script.words(3000, delay=0.01) for _ in range(STREAMING)))
        streaming: dict[str, str] = {}
        for _ in range(STREAMING):
            sid = await new_session(a)
            streaming[sid] = (await post(a, sid, "tell me a long story"))["turn_id"]
        for turn_id in streaming.values():
            await until(partial(streaming_started, pg, turn_id))

        trigger.write_text("\n".join(streaming))
        await until(lambda: _stopped(owner), seconds=30)
        paused_at = loop.time()
        assert rows(pg, LOCK_HOLDERS)[0][0] >= 1  # the owner froze inside its batch, holding the lock

        cancelled_sid = next(iter(streaming))
        cancel = await b.post(f"/v1/sessions/{cancelled_sid}/cancel", json={})
        cancel_seconds = loop.time() - paused_at
        assert cancel.status_code == 202, cancel.text
        assert (cancel.json()["cancelled"], cancel.json()["turn_id"]) == (True, streaming[cancelled_sid])
        assert cancel_seconds < LEASE_SECONDS + 2 * HEARTBEAT + MARGIN

        async def all_taken() -> bool:
            closed = all(turn_status(pg, turn_id) for turn_id in streaming.values())
            return closed and owner_of(pg, waiting_turn) != first_owner

        await until(all_taken, seconds=60)
        assert loop.time() - paused_at < LEASE_SECONDS + HEARTBEAT + MARGIN
        statuses = {sid: turn_status(pg, turn_id) for sid, turn_id in streaming.items()}
        assert statuses == {sid: "cancelled" if sid == cancelled_sid else "interrupted" for sid in streaming}
        assert rows(pg, "SELECT state FROM turn_leases WHERE turn_id = %s", waiting_turn) == [("running",)]

        left = _state(pg, [*streaming, waiting_sid])
        owner.resume()
        for sid, turn_id in streaming.items():
            lost = f"turn {turn_id} of session {sid} lost its lease"
            await until(partial(_logged, owner, lost), seconds=30)
        # A window for the zombie's writes (its heartbeat and batches run every second at most): none lands.
        await asyncio.sleep(2 * HEARTBEAT)
        assert _state(pg, [*streaming, waiting_sid]) == left

        upstream.enqueue(Script.text("You are in Paris."))
        await answered_on(b, pg, waiting_sid, waiting_turn)
    assert turn_status(pg, waiting_turn) == "completed"
    assert_strictly_valid(upstream)


def _state(pg: ScratchDatabase, session_ids: list[str]) -> dict[str, object]:
    """The sessions' events, history and leases, but when a running lease expires: the survivor's
    heartbeat renews the one it took over."""
    found: dict[str, object] = {}
    for sid in session_ids:
        events, history, leases = snapshot(pg, sid)
        found[sid] = (events, history, [(*row[:4], row[5:]) for row in leases])
    return found


async def _logged(server: ServerProcess, text: str) -> bool:
    return text in server.log()
