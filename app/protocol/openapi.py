"""The published contract: FastAPI's spec completed with the event stream, generated, never hand-written.

`install_openapi(app)` makes `app.openapi()` add, to what FastAPI derives from the routes:

* every event model of `protocol.events.Event` as a named component, and `Event`, their union discriminated
  on `type`, both generated from the models the server serializes, so the spec follows the wire;
* `EventFrame`, one SSE frame as the stream sends it: `id` (the seq), `event` (the type) and `data`, a
  string of `application/json` whose `contentSchema` is `Event`. It is the `text/event-stream` schema of
  the stream operation (any operation whose response declares that media type without a schema of its
  own, as the kits' adapters do): for a stream, the
  schema describes each event as a client's SSE parser yields it (what OpenAPI 3.2 calls `itemSchema`,
  and how tools for 3.1 read `schema`), not the JSON inside it;
* `Event` as the `application/x-ndjson` schema of the same operation, read the same way: each line is
  one event. Both framings are also described in the operation's description;
* `ErrorResponse` as the 422 body: the one error handler renders every validation error in that shape,
  not in FastAPI's `HTTPValidationError`;
* links (OpenAPI `links`) from what a request creates to the operations that use it: a created session's
  `id` to every operation on `/v1/sessions/{session_id}...`, a posted message's `turn_id` to its turn and
  its `id` to its withdrawal, so that a generic client (schemathesis's stateful phase) can chain them;
* optional parameters without `null`: a query parameter or header that is not sent is absent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from app.protocol.events import Event

SCHEMAS = "#/components/schemas/"
EVENT = "Event"
EVENT_FRAME = "EventFrame"
ERROR = "ErrorResponse"
STREAM_MEDIA_TYPE = "text/event-stream"
NDJSON_MEDIA_TYPE = "application/x-ndjson"
_FASTAPI_422 = ("HTTPValidationError", "ValidationError")

FRAMING_HEADING = "**Frames**"
FRAMING = f"""{FRAMING_HEADING} (`text/event-stream`): one frame per event, its `data:` the `Event` schema.

```
id: 42
event: text_delta
data: {{"type":"text_delta","seq":42,"session_id":"s_…","id":"m_…","text":"Hel"}}
```

`id:` is the event's `seq` (the session's sequence number, +1 per event, kept across restarts), `event:`
its `type`, and `data:` one JSON object discriminated on `type` that always carries `type`, `seq` and
`session_id`. Lines that carry no event: `retry:` (the reconnection delay, in milliseconds) and `: ping`
heartbeat comments.

**Lines** (`application/x-ndjson`): one line per event, the same JSON as the frame's `data:` (the `Event`
schema; its `seq` is the position to resume after), then `\\n`:

```
{{"type":"text_delta","seq":42,"session_id":"s_…","id":"m_…","text":"Hel"}}
```

A blank line is the heartbeat: skip it (jq reads it as whitespace). There is no `retry:` line."""


class _WireSchema(GenerateJsonSchema):
    """Describes a model that post-processes its own serialization by its fields, as they are sent.

    A wrap serializer returning a dict (TextDelta drops its first-delta-only fields when absent) would
    otherwise make the model an untyped object. Its fields are what is sent, except that those with
    defaults may be left out rather than sent with the default, so they lose their `default`.
    Every other field with a default is sent with it, which is what a default means to openapi-typescript.
    """

    def ser_schema(
        self,
        schema: core_schema.SerSchema | core_schema.IncExSeqSerSchema | core_schema.IncExDictSerSchema,
    ) -> JsonSchemaValue | None:
        if _drops_fields(schema):
            return None
        return super().ser_schema(schema)

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        if self.mode == "serialization" and _drops_fields(schema.get("serialization")):
            required = set(json_schema.get("required", []))
            for name, field in json_schema.get("properties", {}).items():
                if name not in required:
                    field.pop("default", None)
        return json_schema


def _drops_fields(serialization: Mapping[str, Any] | None) -> bool:
    return (
        serialization is not None
        and serialization["type"] == "function-wrap"
        and serialization.get("return_schema", {}).get("type") == "dict"
    )


def event_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """The event components by name and the `Event` union, as the server serializes them."""
    generated = TypeAdapter(Event).json_schema(
        mode="serialization", ref_template=SCHEMAS + "{model}", schema_generator=_WireSchema
    )
    components: dict[str, Any] = generated.pop("$defs")
    discriminator = generated["discriminator"]
    for ref in discriminator["mapping"].values():
        # The discriminator is always on the wire (OpenAPI requires it of every member), even though
        # each model declares it with a default.
        member = components[ref.removeprefix(SCHEMAS)]
        member["required"] = [discriminator["propertyName"], *member.get("required", [])]
    return components, generated


def frame_schema(event_types: list[str]) -> dict[str, Any]:
    """One SSE frame carrying an event: the fields a client's SSE parser gives it."""
    return {
        "title": EVENT_FRAME,
        "description": "One frame of the event stream, as an SSE parser (EventSource) yields it. Frames "
        "without data (`retry:`, `: ping`) carry no event and are not described.",
        "type": "object",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {
                "type": "string",
                "pattern": "^[0-9]+$",
                "description": "The event's `seq`: send it back as Last-Event-ID to resume after it.",
            },
            "event": {"type": "string", "enum": event_types, "description": "The event's `type`."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": SCHEMAS + EVENT},
                "description": "The event, one JSON object of the `Event` schema.",
            },
        },
    }


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` return the completed spec, built once."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            _add_events(spec)
            _document_streams(spec)
            _request_tags_required(spec)
            _validation_errors(spec)
            _malformed_requests(spec)
            _add_links(spec)
            _parameters_not_null(spec)
            _bearer_tokens(spec)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


BEARER_JWT = "BearerJWT"


def _bearer_tokens(spec: dict[str, Any]) -> None:
    """A JWT as the alternative to a key wherever a key is asked for: the same `Authorization: Bearer`
    header (one dependency reads it), shown as its own scheme so that generators and the docs page offer
    both (docs/auth.md)."""
    schemes: dict[str, Any] = spec.setdefault("components", {}).setdefault("securitySchemes", {})
    if "ApiKey" not in schemes:
        return
    schemes[BEARER_JWT] = {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "`Authorization: Bearer <jwt>`: a token of the identity provider "
        "(PARLEY_JWT_JWKS_URL) or of the product's backend (PARLEY_JWT_SECRET), when either is set. "
        'A refused token: 401 `invalid_token` with `WWW-Authenticate: Bearer error="invalid_token"`.',
    }
    for operation in _operations(spec):
        security = operation.get("security")
        if security and {"ApiKey": []} in security and {BEARER_JWT: []} not in security:
            security.append({BEARER_JWT: []})


def _add_events(spec: dict[str, Any]) -> None:
    schemas: dict[str, Any] = spec.setdefault("components", {}).setdefault("schemas", {})
    components, union = event_schemas()
    frame = frame_schema(sorted(union["discriminator"]["mapping"]))
    for name, schema in {**components, EVENT: union, EVENT_FRAME: frame}.items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(f"The event schema {name!r} collides with a REST schema of the same name")


_STREAM_ITEMS = {STREAM_MEDIA_TYPE: EVENT_FRAME, NDJSON_MEDIA_TYPE: EVENT}


def _document_streams(spec: dict[str, Any]) -> None:
    for operation in _operations(spec):
        # A stream that declares its own schema (the kits' adapters, app.api.kits) is not Parley's.
        streams = [
            (response["content"][media_type], item)
            for response in operation.get("responses", {}).values()
            for media_type, item in _STREAM_ITEMS.items()
            if media_type in response.get("content", {}) and "schema" not in response["content"][media_type]
        ]
        if not streams:
            continue
        for media, item in streams:
            media.clear()
            media["schema"] = {"$ref": SCHEMAS + item}
        description = operation.get("description", "")
        if FRAMING_HEADING not in description:
            operation["description"] = f"{description}\n\n{FRAMING}".strip()


def _request_tags_required(spec: dict[str, Any]) -> None:
    """In request bodies, a discriminated union's tag is required in each of its members: the server refuses
    a member without its tag even where the model gives the tag a default (AG-UI's package models do), and
    a spec that let it out would call refused data valid."""
    schemas: dict[str, Any] = spec.get("components", {}).get("schemas", {})
    seen: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(SCHEMAS) and ref not in seen:
            seen.add(ref)
            walk(schemas.get(ref[len(SCHEMAS) :]))
        discriminator = node.get("discriminator")
        if isinstance(discriminator, dict):
            tag = discriminator["propertyName"]
            for target in discriminator.get("mapping", {}).values():
                member = schemas.get(target[len(SCHEMAS) :], {})
                if tag in member.get("properties", {}) and tag not in member.setdefault("required", []):
                    member["required"].append(tag)
        for key, value in node.items():
            if key != "$ref":
                walk(value)

    for operation in _operations(spec):
        walk(operation.get("requestBody"))


def _validation_errors(spec: dict[str, Any]) -> None:
    fastapi_ref = SCHEMAS + _FASTAPI_422[0]
    for operation in _operations(spec):
        response = operation.get("responses", {}).get("422")
        body = response.get("content", {}).get("application/json", {}) if response else {}
        if body.get("schema") == {"$ref": fastapi_ref}:
            body["schema"] = {"$ref": SCHEMAS + ERROR}
            response["description"] = "Validation error"
    schemas = spec.get("components", {}).get("schemas", {})
    for name in _FASTAPI_422:  # HTTPValidationError first: it is what refers to ValidationError
        schema = schemas.pop(name, None)
        if schema is not None and f'"{SCHEMAS}{name}"' in json.dumps(spec):
            schemas[name] = schema


MALFORMED = (
    "The HTTP request itself is malformed (a broken header such as an invalid `Transfer-Encoding`): the "
    "HTTP server refuses it in plain text, before the service reads it, and closes the connection"
)


def _malformed_requests(spec: dict[str, Any]) -> None:
    """Any route may get the HTTP server's own 400: it comes before the app, so no route declares it."""
    for operation in _operations(spec):
        response = operation.setdefault("responses", {}).setdefault("400", {"description": MALFORMED})
        if response["description"] != MALFORMED:
            response["description"] = f"{response['description']}; or: {MALFORMED}"
        response.setdefault("content", {})["text/plain"] = {"schema": {"type": "string"}}


SESSIONS = "/v1/sessions"
SESSION = "/v1/sessions/{session_id}"
MESSAGES = SESSION + "/messages"


def _add_links(spec: dict[str, Any]) -> None:
    paths: dict[str, Any] = spec.get("paths", {})
    created = paths.get(SESSIONS, {}).get("post", {}).get("responses", {}).get("201")
    if created is not None:
        created["links"] = {
            _link_name(operation["operationId"]): {
                "operationId": operation["operationId"],
                "parameters": {"session_id": "$response.body#/id"},
                "description": "The session just created.",
            }
            for path, item in paths.items()
            if path.startswith(SESSION)
            for operation in _in(item)
        }
    accepted = paths.get(MESSAGES, {}).get("post", {}).get("responses", {}).get("202")
    if accepted is None:
        return
    links: dict[str, Any] = {}
    uses = {SESSION + "/turns/{turn_id}": "turn_id", SESSION + "/queue/{message_id}": "message_id"}
    for path, parameter in uses.items():
        for operation in _in(paths.get(path, {})):
            source = "$response.body#/turn_id" if parameter == "turn_id" else "$response.body#/id"
            links[_link_name(operation["operationId"])] = {
                "operationId": operation["operationId"],
                "parameters": {"session_id": "$request.path.session_id", parameter: source},
                "description": f"The message's {'turn' if parameter == 'turn_id' else 'withdrawal'}.",
            }
    accepted["links"] = links


def _parameters_not_null(spec: dict[str, Any]) -> None:
    """An optional parameter is left out, never sent as null: a query or header has no null (a client
    following FastAPI's `anyOf [..., null]` would send the text `null`)."""
    for operation in _operations(spec):
        for parameter in operation.get("parameters", []):
            schema = parameter.get("schema", {})
            options = [option for option in schema.get("anyOf", []) if option != {"type": "null"}]
            if len(options) == 1 and len(schema["anyOf"]) == 2:
                del schema["anyOf"]
                schema.update(options[0])


def _link_name(operation_id: str) -> str:
    """FastAPI's operation ids end with the path and method; the function name before them reads well."""
    return "".join(part.title() for part in operation_id.split("_v1_", 1)[0].split("_"))


def _in(item: dict[str, Any]) -> list[dict[str, Any]]:
    return [operation for method, operation in item.items() if method in _METHODS]


_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _operations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        operation
        for item in spec.get("paths", {}).values()
        for method, operation in item.items()
        if method in _METHODS
    ]
