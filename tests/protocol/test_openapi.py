"""The published contract's generated parts (app.protocol.openapi): every event model as a component with its
`type`, the union discriminated on it, the SSE frame, and what `install_openapi` adds to a FastAPI app's
spec. The whole committed spec against a live server: tests/contract/test_openapi.py."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from app.protocol.events import Event
from app.protocol.openapi import (
    EVENT,
    EVENT_FRAME,
    FRAMING_HEADING,
    event_schemas,
    frame_schema,
    install_openapi,
)

SCHEMAS = "#/components/schemas/"


def event_models() -> list[type[BaseModel]]:
    return list(get_args(get_args(Event)[0]))


def type_of(model: type[BaseModel]) -> str:
    literal: str = model.model_fields["type"].default
    return literal


def test_every_event_model_is_a_component_with_its_type() -> None:
    components, union = event_schemas()
    models = event_models()
    assert len(models) == 20
    for model in models:
        schema = components[model.__name__]
        assert schema["properties"]["type"]["const"] == type_of(model)
        assert schema["required"][0] == "type"  # always on the wire, though declared with a default
        assert {"seq", "session_id"} <= set(schema["required"])
    assert union["discriminator"] == {
        "propertyName": "type",
        "mapping": {type_of(m): SCHEMAS + m.__name__ for m in models},
    }
    assert union["oneOf"] == [{"$ref": SCHEMAS + m.__name__} for m in models]


def test_fields_a_model_leaves_out_when_absent_have_no_default() -> None:
    components, _ = event_schemas()
    for name in ("TextDelta", "ReasoningDelta"):
        delta = components[name]["properties"]
        assert "timestamp" not in components[name]["required"]
        assert "default" not in delta["timestamp"] and "default" not in delta["model"]
    # Elsewhere a default is what is sent when the field is not set.
    assert components["AgentStatus"]["properties"]["tool_name"]["default"] is None


def test_the_frame_carries_the_seq_the_type_and_the_event_as_json() -> None:
    frame = frame_schema(["turn_done", "turn_start"])
    assert frame["title"] == EVENT_FRAME
    assert frame["required"] == ["id", "event", "data"]
    assert frame["properties"]["id"]["pattern"] == "^[0-9]+$"
    assert frame["properties"]["event"]["enum"] == ["turn_done", "turn_start"]
    data = frame["properties"]["data"]
    assert (data["contentMediaType"], data["contentSchema"]) == (
        "application/json",
        {"$ref": SCHEMAS + EVENT},
    )


class Thing(BaseModel):
    name: str


def app_with(rest_model: type[BaseModel] | None = None) -> FastAPI:
    app = FastAPI()

    @app.post("/things")
    async def create(thing: Thing) -> Thing:
        return thing

    streams: dict[str, Any] = {"text/event-stream": {}, "application/x-ndjson": {}}

    @app.get("/stream", responses={200: {"content": streams}}, description="The stream.")
    async def stream() -> None: ...

    if rest_model is not None:

        @app.get("/rest", response_model=rest_model)
        async def rest() -> Any: ...

    install_openapi(app)
    return app


def test_install_openapi_adds_the_events_and_describes_the_stream_and_the_422() -> None:
    app = app_with()
    spec = app.openapi()
    assert app.openapi() is spec  # built once
    schemas = spec["components"]["schemas"]
    assert {EVENT, EVENT_FRAME, "TurnDone", "TextDelta"} <= set(schemas)
    stream = spec["paths"]["/stream"]["get"]
    content = stream["responses"]["200"]["content"]
    assert content["text/event-stream"] == {"schema": {"$ref": SCHEMAS + EVENT_FRAME}}
    assert content["application/x-ndjson"] == {"schema": {"$ref": SCHEMAS + EVENT}}
    assert stream["description"].startswith("The stream.\n\n" + FRAMING_HEADING)
    invalid = spec["paths"]["/things"]["post"]["responses"]["422"]
    assert invalid["content"]["application/json"]["schema"] == {"$ref": SCHEMAS + "ErrorResponse"}
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas


def test_an_event_component_that_collides_with_a_rest_schema_is_refused() -> None:
    turn_done = type("TurnDone", (BaseModel,), {"__annotations__": {"x": int}})  # not the event's shape
    app = app_with(turn_done)
    with pytest.raises(RuntimeError, match="'TurnDone' collides"):
        app.openapi()
