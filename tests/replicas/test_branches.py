"""Branches across replicas on one PostgreSQL database: two regenerate requests for the same turn, posted
at once on two replicas, start one turn (the other is refused with 409 naming it: the lease claim is the
arbiter, not a process's memory); the same Idempotency-Key on both replicas opens one turn and both get
its answer; an activate posted on one replica reaches a stream open on the other as branch_changed."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.replicas.conftest import Replicas, clients
from tests.support.sse import EventReader

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_concurrent_regenerates_on_two_replicas_start_one_turn(
    replicas: Replicas, upstream: FakeUpstream
) -> None:
    a, b = await replicas(2)
    async with clients(a, b) as (ca, cb):
        sid = (await ca.post("/v1/sessions", json={})).json()["id"]
        upstream.enqueue(Script.text("first"))
        asked = await ca.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "q1"})
        t1 = asked.json()["turn_id"]

        # Slow enough that both requests meet a running turn, wherever it runs.
        upstream.enqueue(Script.words(60, delay=0.05), Script.words(60, delay=0.05))
        path = f"/v1/sessions/{sid}/turns/{t1}/regenerate"
        answers = await asyncio.gather(ca.post(path), cb.post(path))
        assert sorted(r.status_code for r in answers) == [202, 409], [r.text for r in answers]
        [opened] = [r.json()["turn_id"] for r in answers if r.status_code == 202]
        [refused] = [r.json() for r in answers if r.status_code == 409]
        assert refused["error"]["details"]["turn_id"] == opened
        ended = await cb.get(f"/v1/sessions/{sid}/turns/{opened}?wait=true")
        assert ended.json()["status"] == "completed", ended.text
        assert len(upstream.requests) == 2

        # One key on both replicas: one turn, one answer.
        key = {"Idempotency-Key": "regen-across"}
        keyed = await asyncio.gather(ca.post(path, headers=key), cb.post(path, headers=key))
        assert [r.status_code for r in keyed] == [202, 202], [r.text for r in keyed]
        assert keyed[0].json() == keyed[1].json()
        await ca.get(f"/v1/sessions/{sid}/turns/{keyed[0].json()['turn_id']}?wait=true")
        assert len(upstream.requests) == 3
        turn = (await ca.get(f"/v1/sessions/{sid}/turns/{t1}")).json()
        assert turn["siblings"] == [t1, opened, keyed[0].json()["turn_id"]]

        # Activate on A: a stream open on B hears it.
        async with EventReader(cb, f"/v1/sessions/{sid}/events") as reader:
            activated = await ca.post(f"/v1/sessions/{sid}/turns/{t1}/activate")
            assert activated.status_code == 200, activated.text
            [changed] = await reader.wait_type("branch_changed", timeout=30)
        assert (changed.data["head_turn_id"], changed.data["path_turn_ids"]) == (t1, [t1])
        history = (await cb.get(f"/v1/sessions/{sid}/messages")).json()["chat_messages"]
        assert [m["content"] for m in history if m["type"] == "text"] == ["q1", "first"]
