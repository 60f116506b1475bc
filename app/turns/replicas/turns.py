"""Turn control when several replicas serve one database (PARLEY_REDIS_URL): requests act on a turn
wherever it runs.

This process's runner still runs the turns it took. What a request needs from a turn that runs on
another replica goes there, or is read from what that replica commits:
- a cancel sets the turn's durable cancel flag first, then is broadcast on the control channel; the
  replica that runs the turn stops it with its own runner (once, whichever reaches it first) and answers
  with the same result a local cancel gives; the stop before a delete is broadcast;
- a steer or interrupt message posted here for a turn of another replica is stored, then announced on
  the control channel: the owner re-reads its waiting line (it also does at each heartbeat, so without
  Redis it learns of it a heartbeat later) and acts on it as on one posted there;
- client tool results and approval decisions go to the turn's replica the same way, and its refusal
  (409, 410, 422) comes back as it would have been given there;
- a delete is then done here and announced, so every replica forgets the session and ends its streams;
- live status (GET /v1/sessions/{id}, and so `until_idle`) of a turn running elsewhere is read from the
  database: its lease and the last agent_status its owner logged;
- `turn_end` and `taker` (what `?wait=true` waits on) follow the session's committed events (the fan-out,
  which falls back to polling the log without Redis) and the turn's rows, never another process's memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from app.errors import DomainError, Unavailable
from app.protocol.files import Attachment
from app.protocol.schemas import CancelResult, Delivery, MessageAccepted, QueuedMessage
from app.protocol.tool_requests import ClientTool, Resolution
from app.storage import leases, repository, turn_queries
from app.storage.engine import Database
from app.storage.leases import LeaseRecord
from app.storage.tables import ChatSessionRow
from app.streaming.broker import EventFanOut, Subscription
from app.streaming.frames import Frame
from app.streaming.redis.control_bus import ControlBus, Handler
from app.turns.live import LiveStatus
from app.turns.pending_calls import Kind
from app.turns.replicas.lease import LeaseKeeper
from app.turns.runtime.runner import Runner

log = logging.getLogger(__name__)

# Longest wait for the turn's replica to answer a cancel (it answers once the turn's end is committed).
CONTROL_TIMEOUT = 10.0
# A wait on another replica's turn also re-reads the turn's rows this often (events carry the end).
RECHECK_SECONDS = 1.0


class OwnerUnreachable(Unavailable):
    code = "turn_owner_unreachable"


class ReplicaTurns:
    """The TurnControl of a replica: the local runner, plus the control channel and the fan-out."""

    def __init__(
        self,
        runner: Runner,
        keeper: LeaseKeeper,
        bus: Callable[[Handler], ControlBus],
        fanout: EventFanOut,
        database: Database,
    ) -> None:
        """`bus` makes the control bus this replica asks and answers on, given what answers (`_handle`)."""
        self._runner = runner
        self._keeper = keeper
        self.bus = self._bus = bus(self._handle)
        self._fanout = fanout
        self._database = database

    @property
    def closing(self) -> bool:
        return self._runner.closing

    async def statuses(self, session_ids: Sequence[str]) -> dict[str, LiveStatus]:
        """A turn running here: this runner's status. Any other session: what the database says, which is
        right without Redis too and costs one read for the lot: the running lease names the open turn,
        and the session's last logged agent_status is the status its owner last announced."""
        found = await self._runner.statuses(session_ids)
        elsewhere = [session_id for session_id in session_ids if not self._runner.runs(session_id)]
        if elsewhere:
            async with self._database.read() as db:
                running = await leases.running_statuses(db, elsewhere)
            found.update({sid: _announced(*running[sid]) for sid in elsewhere if sid in running})
        return found

    def is_closed(self, session_id: str) -> bool:
        return self._runner.is_closed(session_id)

    async def post(
        self,
        session: ChatSessionRow,
        content: str,
        sender: str,
        delivery: Delivery,
        *,
        message_id: str | None = None,
        client_message_id: str | None = None,
        client_tools: list[ClientTool] | None = None,
        attachments: list[Attachment] | None = None,
        note: str | None = None,
    ) -> MessageAccepted:
        accepted = await self._runner.post(
            session,
            content,
            sender,
            delivery,
            message_id=message_id,
            client_message_id=client_message_id,
            client_tools=client_tools,
            attachments=attachments,
            note=note,
        )
        if not accepted.queued or delivery not in ("steer", "interrupt") or self._runner.runs(session.id):
            return accepted
        # It waits for a turn of another replica, and must reach that turn before it ends: the owner
        # re-reads its waiting line now (or, without Redis, at its next heartbeat).
        await self._bus.notify("waiting", session.id, {})
        if delivery == "steer":
            return accepted
        # An interrupt answers, as in one process, with the turn that takes it once the owner stopped
        # its turn; still waiting after CONTROL_TIMEOUT, it answers queued (it is taken all the same).
        with suppress(TimeoutError):
            async with asyncio.timeout(CONTROL_TIMEOUT):
                turn_id = await self.taker(session.id, accepted.id)
                return accepted.model_copy(update={"turn_id": turn_id, "queued": turn_id is None})
        return accepted

    async def branch(
        self,
        session: ChatSessionRow,
        messages: list[QueuedMessage],
        parent_turn_id: str | None,
        *,
        turn_id: str,
    ) -> str:
        """Opened here under a lease as any turn: the claim refuses it while a turn runs on any replica."""
        return await self._runner.branch(session, messages, parent_turn_id, turn_id=turn_id)

    async def activate(self, session_id: str, turn_id: str) -> tuple[str, list[str]]:
        return await self._runner.activate(session_id, turn_id)

    async def queue(self, session_id: str) -> list[QueuedMessage]:
        return await self._runner.queue(session_id)

    async def withdraw(self, session_id: str, message_ids: list[str] | None = None) -> list[QueuedMessage]:
        withdrawn = await self._runner.withdraw(session_id, message_ids)
        if withdrawn and not self._runner.runs(session_id):
            # The owner's mirror of the line drops them too: a withdrawn steer asks for no breakpoint.
            await self._bus.notify("waiting", session_id, {})
        return withdrawn

    async def answer(self, session_id: str, kind: Kind, items: list[dict[str, Any]]) -> list[Resolution]:
        """Client tool results and approval decisions, to the replica whose turn waits for them."""
        if self._runner.runs(session_id) or await self._open_turn(session_id) is None:
            return await self._runner.answer(session_id, kind, items)
        reply = await self._bus.request(
            "answer", session_id, {"kind": kind, "items": items}, timeout=CONTROL_TIMEOUT
        )
        if reply is None:
            if self._runner.runs(session_id) or await self._open_turn(session_id) is None:
                return await self._runner.answer(session_id, kind, items)
            raise OwnerUnreachable(
                "The turn runs on another replica that did not take the answer; send it again.",
                details={"session_id": session_id},
                retry_after=1,
            )
        refused = reply.get("refused")
        if refused is not None:
            raise DomainError.from_wire(refused)
        return [Resolution.model_validate(r) for r in reply["resolved"]]

    # --- stopping --------------------------------------------------------------------------------------

    async def cancel(self, session_id: str, *, clear_queue: bool = False) -> CancelResult:
        """A turn of another replica is cancelled durably first (the flag on its lease, which its owner
        reads at its next heartbeat, or a sweeper honours once the lease expires), then fast (a broadcast
        its owner hears). The answer is the owner's, as a local cancel gives it; without one (Redis down,
        the reply lost, the owner gone) what the flag did, read from the turn's rows once it ended."""
        if self._runner.runs(session_id):
            return await self._runner.cancel(session_id, clear_queue=clear_queue)
        withdrawn = await self._runner.withdraw(session_id) if clear_queue else []
        # The flag's UPDATE also finds the running turn: no read before it, one round trip less.
        flagged = await self._keeper.flag_cancel(session_id)
        if flagged is None:  # none runs (or its successor runs here): what a cancel says now
            result = await self._runner.cancel(session_id)
        else:
            result = await self._owner_stops(flagged)
        return result.model_copy(update={"withdrawn": withdrawn})

    async def _owner_stops(self, flagged: LeaseRecord) -> CancelResult:
        asked = asyncio.ensure_future(
            self._bus.request(
                "cancel", flagged.session_id, {"turn_id": flagged.turn_id}, timeout=CONTROL_TIMEOUT
            )
        )
        ended = asyncio.ensure_future(self._keeper.stopped(flagged))
        try:
            await asyncio.wait({asked, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not asked.done():
                # Ended: the owner answers once its turn's end (and the next turn's start) is done.
                await asyncio.wait({asked}, timeout=RECHECK_SECONDS)
            answer = asked.result() if asked.done() else None
            if answer is not None:
                return CancelResult.model_validate(answer)
            return await ended
        finally:
            asked.cancel()
            ended.cancel()

    async def delete_session(self, session_id: str) -> None:
        if not self._runner.runs(session_id) and await self._open_turn(session_id) is not None:
            # Its replica stops the turn (and deletes the session); then the rows are surely gone here too.
            await self._bus.request("delete", session_id, {}, timeout=CONTROL_TIMEOUT)
        await self._runner.delete_session(session_id)
        await self._bus.notify("deleted", session_id, {})

    async def _handle(self, op: str, session_id: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """A request from another replica: answered only where the session's turn runs."""
        if op == "deleted":
            self._runner.forget(session_id)
            return None
        if not self._runner.runs(session_id):
            return None
        if op == "waiting":
            await self._runner.reread_line(session_id)
            return None
        if op == "cancel":
            if not self._runner.runs_turn(str(args.get("turn_id"))):
                return None  # that turn ended here: its flag's reader answers from its rows
            result = await self._runner.cancel(session_id)
            return result.model_dump(mode="json")
        if op == "delete":
            await self._runner.delete_session(session_id)
            return {}
        if op == "answer":
            try:
                resolved = await self._runner.answer(session_id, args["kind"], args["items"])
            except DomainError as refused:
                # Carried back whole, as its code: the asking replica raises the same error.
                return {"refused": refused.wire()}
            return {"resolved": [r.model_dump(mode="json") for r in resolved]}
        return None

    async def _open_turn(self, session_id: str) -> str | None:
        async with self._database.read() as db:
            return await turn_queries.open_turn_id(db, session_id)

    # --- waiting ---------------------------------------------------------------------------------------

    async def turn_end(self, turn_id: str) -> None:
        """Returns once the turn's end is committed, wherever it runs."""
        if self._runner.owns_turn(turn_id):
            await self._runner.turn_end(turn_id)
            return
        state = await self._turn_state(turn_id)
        if state is None or state[1]:
            return
        subscription = await self._fanout.subscribe(state[0], None)
        try:
            # Subscribed first, then read: an end committed in between is in the rows.
            while not await self._ended(turn_id):
                if await _next_turn_done(subscription, turn_id):
                    return
        finally:
            subscription.close()

    async def taker(self, session_id: str, message_id: str) -> str | None:
        """As the runner's, also for a message another replica's turn takes. Only a turn running here takes
        what this runner's mirror of the line holds: a message posted here while another replica's turn
        runs is in the mirror too, but that replica takes it."""
        if self._runner.runs(session_id) and self._runner.holds_waiting(session_id, message_id):
            return await self._runner.taker(session_id, message_id)
        subscription = await self._fanout.subscribe(session_id, None)
        try:
            while True:
                async with self._database.read() as db:
                    row = await repository.get_message(db, message_id)
                    waiting = row is None and await repository.get_queued(db, message_id) is not None
                if row is not None:
                    return row.turn_id if row.session_id == session_id else None
                if not waiting or self.closing:
                    return None
                await _next_batch(subscription)
        finally:
            subscription.close()

    async def _turn_state(self, turn_id: str) -> tuple[str, bool] | None:
        async with self._database.read() as db:
            return await turn_queries.turn_state(db, turn_id)

    async def _ended(self, turn_id: str) -> bool:
        state = await self._turn_state(turn_id)
        return state is None or state[1]


def _announced(turn_id: str, data: str | None) -> LiveStatus:
    """The running turn with its last logged agent_status (its owner's announcement). The turn's own
    is always there: recorder.open logs `thinking` in the transaction that claims the lease; a status
    of an earlier turn (never seen: the lease and it commit together) reads as that opening one."""
    event = json.loads(data) if data is not None else {}
    status = event.get("status") if event.get("turn_id") == turn_id else None
    return LiveStatus(status or "thinking", turn_id)


async def _next_batch(subscription: Subscription) -> list[Frame]:
    """The subscription's next frames; [] after RECHECK_SECONDS without any."""
    try:
        async with asyncio.timeout(RECHECK_SECONDS):
            batch = await subscription.subscriber.next_batch()
    except TimeoutError:
        return []
    if batch is None:  # the stream ended (deleted, shutdown, overflow): the rows decide
        await asyncio.sleep(RECHECK_SECONDS)
        return []
    return batch


async def _next_turn_done(subscription: Subscription, turn_id: str) -> bool:
    """Whether the subscription's next frames hold the turn's turn_done (its `turn`, set where the event
    was made: frames.Frame)."""
    return any(
        frame.type == "turn_done" and frame.turn == turn_id for frame in await _next_batch(subscription)
    )
