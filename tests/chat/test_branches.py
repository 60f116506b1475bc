"""The branch use cases' pure parts (app.chat.branches) and their bodies (app.protocol.branches): a fork's
copy gives new message and turn ids and maps parents, keeping every other field; the bodies refuse what
the spec refuses. The routes themselves run over a socket in tests/api/test_branches.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.chat.branches import _copies
from app.protocol.branches import ActivateRequest, EditRequest, ForkRequest, RegenerateRequest
from app.storage.tables import ChatMessageRow

AT = "2026-11-29T10:00:00.000+00:00"


def _row(mid: str, turn_id: str, type_: str, parent: str | None = None, **fields: Any) -> ChatMessageRow:
    return ChatMessageRow(
        id=mid,
        session_id="s_from",
        turn_id=turn_id,
        type=type_,
        timestamp=AT,
        parent_turn_id=parent,
        **fields,
    )


def test_a_forks_copy_has_new_ids_mapped_parents_and_the_same_fields() -> None:
    rows = [
        _row("m_1", "t_1", "turn_start"),
        _row("m_2", "t_1", "text", role="user", content="q", sender="U"),
        _row("m_3", "t_1", "turn_done", status="completed", duration_seconds=0.5),
        _row("m_4", "t_2", "turn_start", parent="t_1"),
        _row("m_5", "t_2", "tool_group", tool_call_id="c1", arguments={"a": 1}, result="r", response_id="r1"),
    ]
    copies = _copies(rows, "s_to")
    assert {c.session_id for c in copies} == {"s_to"}
    assert not {c.id for c in copies} & {r.id for r in rows}
    assert len({c.id for c in copies}) == len(rows)
    first, second = copies[0].turn_id, copies[3].turn_id
    assert first not in ("t_1", "t_2") and second not in ("t_1", "t_2", first)
    assert [c.turn_id for c in copies] == [first, first, first, second, second]
    assert (copies[0].parent_turn_id, copies[3].parent_turn_id) == (None, first)
    for copy, row in zip(copies, rows, strict=True):
        for name in ("type", "role", "content", "timestamp", "status", "arguments", "result", "response_id"):
            assert getattr(copy, name) == getattr(row, name), name


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (RegenerateRequest, {"delivery": "steer"}),  # only reject or interrupt: a branch never waits
        (RegenerateRequest, {"model": ""}),
        (RegenerateRequest, {"unknown": 1}),
        (EditRequest, {"content": " \n "}),
        (EditRequest, {}),
        (EditRequest, {"content": "x", "delivery": "queue"}),
        (ActivateRequest, {"delivery": True}),
        (ForkRequest, {"turn_id": "m_000000000000"}),
        (ForkRequest, {}),
    ],
)
def test_bodies_refuse_what_the_spec_refuses(model: type[RegenerateRequest], body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(body)


def test_bodies_take_their_defaults() -> None:
    assert RegenerateRequest().model_dump() == {"model": None, "delivery": "reject"}
    assert EditRequest(content="hi").delivery == "reject"
    assert ForkRequest(turn_id="t_0123456789ab").turn_id == "t_0123456789ab"
