"""The published spec: fresh, complete for every route and event, and true to the frames the server sends."""

from __future__ import annotations

import difflib
import itertools
import json
import re
import socket
from typing import Any, get_args

import httpx
import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from app.protocol.events import Event
from scripts.export_openapi import ROOT, SPEC, render_spec
from tests.support.server import LiveServer
from tests.support.sse import EventReader, Received

SCHEMAS = "#/components/schemas/"
METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    rendered: dict[str, Any] = json.loads(render_spec())
    return rendered


def _event_models() -> list[type[BaseModel]]:
    union = get_args(Event)[0]
    return list(get_args(union))


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def test_the_committed_spec_is_what_the_app_generates() -> None:
    committed = SPEC.read_text() if SPEC.exists() else ""
    generated = render_spec()
    if committed != generated:
        diff = difflib.unified_diff(
            committed.splitlines(), generated.splitlines(), "committed", "generated", lineterm=""
        )
        pytest.fail(
            f"{SPEC.relative_to(ROOT)} differs from what the app generates: run `make openapi` and commit "
            "it.\n" + "\n".join(itertools.islice(diff, 60)),
            pytrace=False,
        )


def test_every_event_is_a_component_and_a_member_of_the_discriminated_union(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    union = schemas["Event"]
    assert union["discriminator"]["propertyName"] == "type"
    mapping = union["discriminator"]["mapping"]
    members = [member["$ref"] for member in union["oneOf"]]
    models = _event_models()
    assert len(members) == len(mapping) == len(models)
    for model in models:
        name, type_ = model.__name__, model.model_fields["type"].default
        ref = SCHEMAS + name
        assert mapping[type_] == ref and ref in members, name
        component = schemas[name]
        assert component["properties"]["type"]["const"] == type_
        assert {"type", "seq", "session_id"} <= set(component["required"]), name
        assert set(component["properties"]) == set(model.model_fields), name


def test_the_stream_is_documented_as_text_event_stream_of_events(spec: dict[str, Any]) -> None:
    operation = spec["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert operation["responses"]["200"]["content"] == {
        "text/event-stream": {"schema": {"$ref": SCHEMAS + "EventFrame"}},
        "application/x-ndjson": {"schema": {"$ref": SCHEMAS + "Event"}},
    }
    [format_] = [p for p in operation["parameters"] if p["name"] == "format"]
    assert format_["in"] == "query" and "Accept" in format_["description"]
    # An optional parameter is absent rather than null: no `anyOf [..., null]` a client would send as "null".
    assert (format_["schema"]["enum"], format_["schema"]["type"]) == (["sse", "ndjson"], "string")
    assert all("anyOf" not in p["schema"] for p in operation["parameters"])
    frame = spec["components"]["schemas"]["EventFrame"]
    assert frame["required"] == ["id", "event", "data"]
    data = frame["properties"]["data"]
    assert (data["type"], data["contentMediaType"]) == ("string", "application/json")
    assert data["contentSchema"] == {"$ref": SCHEMAS + "Event"}
    mapping = spec["components"]["schemas"]["Event"]["discriminator"]["mapping"]
    assert frame["properties"]["event"]["enum"] == sorted(mapping)
    description = operation["description"]
    for word in ("id:", "event:", "data:", "seq", ": ping", "retry:", "resync", "Last-Event-ID", "after"):
        assert word in description, word
    for word in ("application/x-ndjson", "format=ndjson", "blank line", "jq"):
        assert word in description, word


def json_of(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": SCHEMAS + name}}}


def test_the_waiting_routes_document_wait_timeout_the_turn_and_the_504(spec: dict[str, Any]) -> None:
    post = spec["paths"]["/v1/sessions/{session_id}/messages"]["post"]
    turn = spec["paths"]["/v1/sessions/{session_id}/turns/{turn_id}"]["get"]
    assert post["responses"]["202"]["content"] == json_of("MessageAccepted")
    assert post["responses"]["200"]["content"] == json_of("Turn")
    assert turn["responses"]["200"]["content"] == json_of("Turn")
    for operation in (post, turn):
        assert operation["responses"]["504"]["content"] == json_of("ErrorResponse")
        assert "wait_timeout" in operation["responses"]["504"]["description"]
        params = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
        assert (params["wait"]["schema"]["type"], params["wait"]["schema"]["default"]) == ("boolean", False)
        timeout = params["timeout"]["schema"]
        assert (timeout["type"], timeout["exclusiveMinimum"]) == ("number", 0.0)
        assert "wait_required" in params["timeout"]["description"]
        assert "PARLEY_WAIT_TIMEOUT" in params["timeout"]["description"]


def test_every_route_documents_its_errors_as_error_responses(spec: dict[str, Any]) -> None:
    """Every 4xx is an ErrorResponse, but the 400 every route lists: the HTTP server's own plain-text
    answer to a request it cannot parse (no route of the service answers 400 itself)."""
    error = {"application/json": {"schema": {"$ref": SCHEMAS + "ErrorResponse"}}}
    malformed = {"text/plain": {"schema": {"type": "string"}}}
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for method, path, operation in _operations(spec):
        responses = operation["responses"]
        where = f"{method} {path}"
        assert responses["400"]["content"] == malformed, where
        for status, response in responses.items():
            if status.startswith("4") and status != "400":
                assert response.get("content") == error, f"{where} {status}"
        if operation.get("parameters") or operation.get("requestBody"):
            assert "422" in responses, f"{where} validates its input but lists no 422"
        if "{session_id}" in path:
            assert "404" in responses, f"{where} lists no 404 for an unknown session"
        assert any(s.startswith("2") for s in responses), where


@pytest.mark.anyio
async def test_each_event_schema_validates_the_frames_a_demo_turn_sends(
    paced_server: LiveServer, spec: dict[str, Any]
) -> None:
    """A tool round, then a stopped answer with a message waiting: most event types, checked against
    their documented schema (which must not lack a field the server sends) and the union."""
    async with httpx.AsyncClient(base_url=paced_server.base_url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        async with EventReader(client, f"/v1/sessions/{sid}/events") as reader:
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "what time is it?"})
            await reader.wait_type("turn_done")
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "[long] go"})
            await reader.wait_type("text_delta", count=len(reader.of_type("text_delta")) + 5)
            await client.post(f"/v1/sessions/{sid}/messages", json={"content": "and then?"})
            await client.post(f"/v1/sessions/{sid}/cancel")
            await reader.wait_type("turn_done", count=3)

    registry: Registry[Any] = Registry().with_resource(
        "urn:parley", Resource.from_contents(spec, default_specification=DRAFT202012)
    )
    union = Draft202012Validator({"$ref": "urn:parley#/components/schemas/Event"}, registry=registry)
    mapping = spec["components"]["schemas"]["Event"]["discriminator"]["mapping"]
    envelope = Draft202012Validator({"$ref": "urn:parley#/components/schemas/EventFrame"}, registry=registry)
    for frame in reader.events:
        assert frame.data["type"] == frame.event and frame.data["seq"] == int(frame.id)
        as_parsed = {"id": frame.id, "event": frame.event, "data": json.dumps(frame.data)}
        assert not [e.message for e in envelope.iter_errors(as_parsed)], frame
        _validate(frame, union, registry, spec, mapping[frame.event])
    seen = {frame.event for frame in reader.events}
    assert seen >= {
        "turn_start", "user_message", "agent_status", "text_delta", "response_done", "token_usage",
        "tool_exec_start", "tool_exec_end", "agent_cancelled", "turn_done",
    }  # fmt: skip


def _validate(
    frame: Received,
    union: Draft202012Validator,
    registry: Registry[Any],
    spec: dict[str, Any],
    ref: str,
) -> None:
    member = Draft202012Validator({"$ref": "urn:parley" + ref}, registry=registry)
    for validator in (union, member):
        errors = [e.message for e in validator.iter_errors(frame.data)]
        assert not errors, f"{frame.event} #{frame.id}: {errors}"
    documented = set(spec["components"]["schemas"][re.sub("^.*/", "", ref)]["properties"])
    assert set(frame.data) <= documented, f"{frame.event} sends undocumented {set(frame.data) - documented}"


def test_a_request_the_http_server_cannot_parse_gets_the_documented_plain_400(
    server: LiveServer, spec: dict[str, Any]
) -> None:
    """Found by a fresh fuzzing seed: `DELETE /v1/sessions/{id}` with `Transfer-Encoding: %vkB` got the HTTP
    server's own 400, which no route listed. Now every route lists it, as it comes: plain text."""
    documented = spec["paths"]["/v1/sessions/{session_id}"]["delete"]["responses"]["400"]
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"DELETE /v1/sessions/s_x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: %vkB\r\n\r\n")
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 400 Bad Request"
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["content-type"].split(";")[0] in documented["content"]
    assert body == b"Invalid HTTP request received."


def test_every_operation_is_listed_under_one_tag(spec: dict[str, Any]) -> None:
    """Swagger UI lists an operation once per tag: /v1/models under `health` and `models` appeared twice."""
    tagged = {f"{method} {path}": operation.get("tags", []) for method, path, operation in _operations(spec)}
    assert {where: tags for where, tags in tagged.items() if len(tags) != 1} == {}
    assert tagged["GET /v1/models"] == ["models"]


def test_the_stream_says_it_does_not_end_without_until_idle(spec: dict[str, Any]) -> None:
    """A generic client (the schemathesis CLI without the project's hooks) read `GET .../events` to its
    end and hung: the spec now says, in an extension a tool can test and in words, that it is endless."""
    endless = [
        f"{method} {path}"
        for method, path, operation in _operations(spec)
        if operation.get("x-endless-stream")
    ]
    assert endless == ["GET /v1/sessions/{session_id}/events"]
    operation = spec["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert "never ends by itself" in " ".join(operation["description"].split())
    assert "endless unless until_idle=true" in operation["responses"]["200"]["description"]
    [until_idle] = [p for p in operation["parameters"] if p["name"] == "until_idle"]
    assert "never ends by itself" in until_idle["description"]
