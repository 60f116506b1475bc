"""The REST bodies (app.protocol.schemas): the request models refuse what they do not define, wrong types and
values out of range, with the defaults a client may leave out; each chat message kind's `type` default is
in its own literal."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import BaseModel, ValidationError

from app.protocol.schemas import (
    CancelRequest,
    ChatMessage,
    MessageCreate,
    SessionCreate,
    SessionUpdate,
)


def refusal(model: type[BaseModel], body: dict[str, Any]) -> tuple[str, tuple[int | str, ...]]:
    """The one error the body gets: its type and where."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    (error,) = caught.value.errors()
    return error["type"], error["loc"]


@pytest.mark.parametrize(
    ("model", "body", "expected"),
    [
        (SessionCreate, {"model": "parley/demo", "temperature": 0.2}, ("extra_forbidden", ("temperature",))),
        (SessionCreate, {"tools": "calculate"}, ("list_type", ("tools",))),
        (SessionCreate, {"title": "x" * 201}, ("string_too_long", ("title",))),
        (SessionCreate, {"model": 7}, ("string_type", ("model",))),
        (SessionUpdate, {"tools": ["calculate"]}, ("extra_forbidden", ("tools",))),
        (MessageCreate, {"content": "hi", "delivery": "later"}, ("literal_error", ("delivery",))),
        (MessageCreate, {"content": "hi", "role": "system"}, ("extra_forbidden", ("role",))),
        (MessageCreate, {"content": ""}, ("string_too_short", ("content",))),
        (MessageCreate, {"content": " \n\t"}, ("value_error", ("content",))),
        (MessageCreate, {}, ("missing", ("content",))),
        (MessageCreate, {"content": "hi", "sender": ""}, ("string_too_short", ("sender",))),
        (
            MessageCreate,
            {"content": "hi", "client_message_id": "x" * 101},
            ("string_too_long", ("client_message_id",)),
        ),
        (CancelRequest, {"clear_queue": "maybe"}, ("bool_type", ("clear_queue",))),
        (CancelRequest, {"clear_queue": 0}, ("bool_type", ("clear_queue",))),
        (CancelRequest, {"clear_queue": "true"}, ("bool_type", ("clear_queue",))),
        (CancelRequest, {"clear": True}, ("extra_forbidden", ("clear",))),
    ],
)
def test_request_bodies_are_strict(
    model: type[BaseModel], body: dict[str, Any], expected: tuple[str, tuple[str, ...]]
) -> None:
    assert refusal(model, body) == expected


def test_a_blank_message_says_why() -> None:
    with pytest.raises(ValidationError, match="the message is empty"):
        MessageCreate.model_validate({"content": "   "})


def test_what_a_client_may_leave_out() -> None:
    message = MessageCreate.model_validate_json('{"content": "hi"}')
    assert (message.sender, message.delivery, message.client_message_id) == ("User", "steer", None)
    assert SessionCreate.model_validate({}).model_dump() == {
        "model": None,
        "title": None,
        "system_prompt": None,
        "tools": None,
        "client_tools": None,
        "approval": None,
        "metadata": None,
        "context": None,
    }
    assert CancelRequest.model_validate({}).clear_queue is False
    assert SessionUpdate.model_validate({"title": None}).model_dump(exclude_unset=True) == {"title": None}


@pytest.mark.parametrize("model", get_args(ChatMessage), ids=lambda m: m.__name__)
def test_each_chat_message_type_default_is_in_its_literal(model: type[BaseModel]) -> None:
    field = model.model_fields["type"]
    assert get_args(field.annotation) == (field.default,)
