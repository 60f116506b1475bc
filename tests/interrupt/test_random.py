"""A seeded random walk of posts, steers, interrupts, rejects, cancels and withdrawals at random moments.

The strict upstream answers from a long random list of scripts (paced text, tool calls with the `slow`
tool sleeping a little, parallel calls, slow first tokens, streams cut mid-way). The test tracks what the
API acknowledged and, once the session is idle with an empty waiting line, checks the invariants:
- the event stream is contiguous; turn_start and turn_done alternate, one turn_done per turn_start;
- a cancelled turn_done follows its (single) agent_cancelled, and a cancel's 202 lists what it listed;
- every acknowledged message (not withdrawn) is in the history exactly once as a user text, taken by
  exactly one turn; withdrawn and rejected messages never are;
- no turn failed because the strict upstream refused its history, and every request it received (a final
  probe turn included) is a history Anthropic's Messages API would accept.

Reproduce a failure with `-k 'seed'` and the printed seed; `PARLEY_RANDOM_SEED=N` adds a seed.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script, ToolCall, validate_history
from tests.interrupt.session import Session, chat_requests, open_session
from tests.support.server import LiveServer
from tests.support.sse import Received

pytestmark = [
    pytest.mark.anyio,
    # litellm runs the start of a call in a thread; a stop that lands there drops the coroutine the thread
    # returned (litellm/main.py acompletion: `await loop.run_in_executor(...)`), which warns at GC.
    pytest.mark.filterwarnings("ignore:coroutine '.*' was never awaited:RuntimeWarning"),
]

ACTIONS = 220
SEEDS = [
    1,
    20240611,
    *([int(os.environ["PARLEY_RANDOM_SEED"])] if "PARLEY_RANDOM_SEED" in os.environ else []),
]
FIELDS = ("id", "content", "sender", "client_message_id", "timestamp", "delivery")


@pytest.fixture
def strict_settings(strict_settings: Settings) -> Settings:
    """The walk posts a few hundred messages in seconds: the per-principal rate limit is not under test."""
    return strict_settings.model_copy(update={"messages_per_minute": 0})


# --- what the upstream answers ---------------------------------------------------------------------------


def _text(rng: random.Random, n: int) -> Script:
    words = " ".join(f"w{n}.{k}" for k in range(rng.randint(2, 12)))
    return Script.text(words, chunks=rng.randint(2, 8), delay=rng.uniform(0.002, 0.012))


def _calls(rng: random.Random, n: int) -> list[ToolCall]:
    def slow(k: int) -> ToolCall:
        return ToolCall(f"call_{n}_{k}", "slow", f'{{"seconds": {rng.uniform(0.005, 0.12):.3f}}}')

    def calc(k: int) -> ToolCall:
        return ToolCall(f"call_{n}_{k}", "calculate", f'{{"expression": "{rng.randint(1, 99)}*{k + 2}"}}')

    kind = rng.choice(["slow", "calc", "both", "time"])
    if kind == "slow":
        return [slow(0)]
    if kind == "calc":
        return [calc(0)]
    if kind == "time":
        return [ToolCall(f"call_{n}_0", "current_time", '{"timezone": "UTC"}')]
    return [calc(0), slow(1)]


def random_script(rng: random.Random, n: int) -> Script:
    roll = rng.random()
    if roll < 0.5:
        return _text(rng, n)
    if roll < 0.88:
        return Script.tool_calls(
            _calls(rng, n),
            fragments=rng.randint(1, 4),
            text_before=rng.choice([None, f"Let me see ({n})."]),
            delay=rng.uniform(0.002, 0.01),
        )
    if roll < 0.94:
        return Script(text_pieces=[f"slow start {n}"], hang_before_headers=rng.uniform(0.02, 0.15))
    return Script.cut(f"cut short {n} " * 4, after=rng.randint(2, 4), chunks=6, delay=0.005)


# --- the walk --------------------------------------------------------------------------------------------


@dataclass
class Walk:
    session: Session
    rng: random.Random
    seed: int
    acked: dict[str, str] = field(default_factory=dict)  # id -> content, every 202'd message
    rejected: list[str] = field(default_factory=list)  # contents refused with 409
    withdrawn: dict[str, str] = field(default_factory=dict)  # id -> content
    not_found: list[str] = field(default_factory=list)  # ids a withdraw answered 404 for
    interrupt_turns: dict[str, str] = field(default_factory=dict)  # message id -> the turn its 202 named
    cancels: list[dict[str, Any]] = field(default_factory=list)  # 202 bodies
    done: Counter[str] = field(default_factory=Counter)
    counter: int = 0
    probe_id: str = ""
    # Contents whose POST has not answered yet: an interrupt answers only once the turn it stops has
    # ended, so a concurrent cancel with clear_queue may withdraw it before its 202 arrives.
    in_flight: set[str] = field(default_factory=set)

    async def post(self, delivery: str) -> None:
        self.counter += 1
        content = f"s{self.seed}-m{self.counter}-{delivery}"
        self.in_flight.add(content)
        try:
            response = await self.session.post(content, delivery)
        finally:
            self.in_flight.discard(content)
        if response.status_code == 409:
            error = response.json()["error"]
            assert delivery == "reject", response.text
            assert error["code"] == "turn_running" and error["details"]["turn_id"], error
            self.rejected.append(content)
            return
        assert response.status_code == 202, response.text
        body = response.json()
        assert (body["content"], body["delivery"]) == (content, delivery)
        assert body["queued"] is (body["turn_id"] is None)
        self.acked[body["id"]] = content
        if delivery == "interrupt" and body["turn_id"] is not None:
            self.interrupt_turns[body["id"]] = body["turn_id"]

    async def cancel(self, clear_queue: bool) -> None:
        response = await self.session.cancel(clear_queue=clear_queue)
        body = response.json()
        assert response.status_code == (202 if body["cancelled"] else 200), response.text
        for item in body["withdrawn"]:
            assert self.acked.get(item["id"]) == item["content"] or item["content"] in self.in_flight, item
            assert item["id"] not in self.withdrawn, item
            self.withdrawn[item["id"]] = item["content"]
        if body["cancelled"]:
            self.cancels.append(body)

    async def withdraw(self) -> None:
        waiting = await self.session.queue()
        if not waiting:
            return
        target = self.rng.choice(waiting)
        response = await self.session.withdraw(target["id"])
        if response.status_code == 200:
            assert response.json() == {k: target[k] for k in FIELDS}
            assert target["id"] not in self.withdrawn
            self.withdrawn[target["id"]] = target["content"]
        elif response.status_code == 404:
            self.not_found.append(target["id"])  # withdrawn by a concurrent clear_queue
        else:
            assert response.status_code == 409, response.text
            assert response.json()["error"]["code"] == "already_taken"

    async def pause(self) -> None:
        await asyncio.sleep(self.rng.choice([0.0, 0.005, 0.02, 0.05, 0.1]))

    async def act(self, name: str) -> None:
        self.done[name] += 1
        if name.startswith("post_"):
            await self.post(name.removeprefix("post_"))
        elif name == "cancel":
            await self.cancel(clear_queue=False)
        elif name == "cancel_clear":
            await self.cancel(clear_queue=True)
        elif name == "withdraw":
            await self.withdraw()
        else:
            await self.pause()

    async def step(self) -> None:
        names = ["post_steer", "post_queue", "post_interrupt", "post_reject", "cancel", "cancel_clear"]
        names += ["withdraw", "pause", "burst"]
        weights = [20, 12, 7, 7, 8, 3, 6, 30, 7]
        [name] = self.rng.choices(names, weights)
        if name != "burst":
            await self.act(name)
            return
        # A few actions at the same moment, as several clients would send them.
        self.done["burst"] += 1
        together = self.rng.choices(names[:7], weights[:7], k=self.rng.randint(2, 3))
        await asyncio.gather(*(self.act(n) for n in together))


# --- the invariants --------------------------------------------------------------------------------------


def _waiting_line(e: Received) -> bool:
    """Events of the waiting line, which other requests publish in the middle of a turn's events."""
    return e.event == "queue_updated" or (e.event == "user_message" and e.data["queued"])


def check_stream(events: list[Received]) -> dict[str, str]:
    """Contiguous seqs; turns alternate, each closed once, a stop ends idle → agent_cancelled → turn_done.
    Returns turn_id -> final status."""
    seqs = [int(e.id) for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the stream has a gap or a repeat"
    status: dict[str, str] = {}
    running: str | None = None
    inside: list[Received] = []
    for e in events:
        if e.event == "turn_start":
            assert running is None, (
                f"turn {e.data['turn_id']} started while {running} ran; {running} ended with "
                f"{[(x.event, x.data.get('status')) for x in inside[-4:]]}"
            )
            assert e.data["turn_id"] not in status
            running, inside = e.data["turn_id"], []
        elif _waiting_line(e):
            continue
        elif running is None:
            raise AssertionError(f"{e.event} (seq {e.id}) outside any turn")
        elif e.event == "turn_done":
            assert e.data["turn_id"] == running, f"turn_done for {e.data['turn_id']} while {running} ran"
            status[running] = e.data["status"]
            tail = [(x.event, x.data.get("status")) for x in inside[-2:]]
            if e.data["status"] == "cancelled":
                assert tail == [("agent_status", "idle"), ("agent_cancelled", None)], (running, tail)
            else:
                assert tail[-1] == ("agent_status", "idle"), (running, tail)
            running = None
        else:
            assert e.data.get("turn_id", running) == running, f"{e.event} of another turn inside {running}"
            inside.append(e)
    assert running is None, f"turn {running} never got its turn_done"
    cancelled = [e.data["turn_id"] for e in events if e.event == "agent_cancelled"]
    assert sorted(cancelled) == sorted(t for t, s in status.items() if s == "cancelled")
    return status


def check_messages(walk: Walk, events: list[Received], history: list[dict[str, Any]]) -> None:
    assert set(walk.withdrawn) <= set(walk.acked), "a withdrawn message was never acknowledged"
    kept = {i: c for i, c in walk.acked.items() if i not in walk.withdrawn}
    users = [m for m in history if m["type"] == "text" and m["role"] == "user"]
    stored = Counter(m["id"] for m in users)
    assert {i for i, n in stored.items() if n > 1} == set(), "a message was stored twice"
    assert set(stored) - {walk.probe_id} == set(kept), (
        f"lost: {sorted(set(kept) - set(stored))}, unexpected: {sorted(set(stored) - set(kept))}"
    )
    assert all(m["content"] == kept[m["id"]] for m in users if m["id"] in kept)
    contents = {m["content"] for m in users}
    assert contents.isdisjoint(walk.rejected), "a rejected message was stored"
    assert contents.isdisjoint(walk.withdrawn.values()), "a withdrawn message was stored"
    assert set(walk.not_found) <= set(walk.withdrawn), "a waiting message was lost (withdraw answered 404)"

    taken = [e.data for e in events if e.event == "user_message" and not e.data["queued"]]
    assert Counter(t["id"] for t in taken) == Counter(stored), "a message was taken twice, or never"
    by_id = {t["id"]: t["turn_id"] for t in taken}
    for message_id, turn_id in walk.interrupt_turns.items():
        assert by_id[message_id] == turn_id, "an interrupt's 202 named a turn that did not take it"

    # chat_messages: one turn_done row per turn_start row, and one stored result per tool call.
    markers = [(m["type"], m["turn_id"]) for m in history if m["type"] in ("turn_start", "turn_done")]
    assert markers[0::2] == [("turn_start", t) for _, t in markers[1::2]] and len(markers) % 2 == 0
    calls = [m for m in history if m["type"] == "tool_group"]
    assert len({c["tool_call_id"] for c in calls}) == len(calls), "a tool call was stored twice"
    assert [c for c in calls if c["result"] is None] == [], "a tool call has no stored result"


def check_cancels(walk: Walk, events: list[Received], status: dict[str, str]) -> None:
    cancelled = {e.data["turn_id"]: e.data for e in events if e.event == "agent_cancelled"}
    for body in walk.cancels:
        assert status.get(body["turn_id"]) == "cancelled", f"a 202 cancel for a turn that was not: {body}"
        event = cancelled[body["turn_id"]]
        assert body["interrupted_message_ids"] == event["interrupted_message_ids"]
        assert body["interrupted_tool_call_ids"] == event["interrupted_tool_call_ids"]


def check_upstream(upstream: FakeUpstream, events: list[Received]) -> None:
    refused = [e.data for e in events if e.event == "error" and e.data["code"] == "provider_bad_request"]
    assert refused == [], "the strict upstream refused a history"
    for request in chat_requests(upstream):
        assert request.problems == [], request.problems
        assert validate_history(request.body["messages"]) == [], request.body["messages"]


async def settle(session: Session, quiet: float = 2.0, limit: float = 20.0) -> None:
    """Waits until the session is idle with nothing waiting, or nothing happened for `quiet` s (stuck)."""
    loop = asyncio.get_running_loop()
    started = last_change = loop.time()
    seen = len(session.reader.events)
    while loop.time() - started < limit:
        if await session.is_idle():
            await asyncio.sleep(0.15)
            if len(session.reader.events) == seen and await session.is_idle():
                return
        if len(session.reader.events) != seen:
            seen, last_change = len(session.reader.events), loop.time()
        elif loop.time() - last_change > quiet:
            return  # stuck: the checks below say how
        await asyncio.sleep(0.02)


def _breakpoints(events: list[Received]) -> int:
    """Completed turns that ended right after a tool round's results (a steer took over there)."""
    count, last = 0, ""
    for e in events:
        if e.event == "turn_done" and e.data["status"] == "completed" and last == "tool_exec_end":
            count += 1
        if e.event not in ("agent_status", "queue_updated", "user_message", "turn_done"):
            last = e.event
    return count


def _taken(events: list[Received]) -> dict[str, str]:
    """message id -> the turn that took it."""
    return {
        e.data["id"]: e.data["turn_id"] for e in events if e.event == "user_message" and not e.data["queued"]
    }


# --- the test --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_interruptions_keep_every_invariant(
    server: LiveServer, upstream: FakeUpstream, seed: int
) -> None:
    print(f"\nrandom interrupt walk: seed={seed}, {ACTIONS} actions")
    rng = random.Random(seed)
    upstream.enqueue(*(random_script(rng, n) for n in range(1500)))
    async with open_session(server) as session:
        walk = Walk(session, rng, seed)
        for _ in range(ACTIONS):
            await walk.step()
        print(f"actions: {dict(walk.done)}")
        assert walk.done["post_interrupt"] and walk.done["cancel"] and walk.done["withdraw"]
        await settle(session)
        # The probe must get a plain answer, not the next random script (some are cut streams).
        upstream.clear_scripts()
        upstream.enqueue(Script.text("All good."))
        probe = await session.post(f"s{seed}-final probe")
        assert probe.status_code == 202, probe.text
        walk.probe_id = probe.json()["id"]
        await settle(session)

        events = list(session.reader.events)
        status = check_stream(events)
        print(
            f"turns: {dict(Counter(status.values()))}, at a breakpoint: {_breakpoints(events)}, "
            f"requests: {len(chat_requests(upstream))}"
        )
        check_upstream(upstream, events)
        # The session ends idle with nothing waiting, and the turn after the walk completed.
        info, waiting = await session.info(), await session.queue()
        assert (info["agent_status"], info["running_turn_id"], waiting) == ("idle", None, []), (
            f"the session is stuck: {len(waiting)} message(s) wait, the last turn_done was seq "
            f"{next((e.id for e in reversed(events) if e.event == 'turn_done'), None)} of {events[-1].id}"
        )
        assert status.get(_taken(events).get(walk.probe_id, "")) == "completed", "the probe turn"
        check_messages(walk, events, await session.history())
        check_cancels(walk, events, status)
