"""The kits' routes in the published contract: their answers are documented as streams of their own (each
frame's `data` a chunk or an event of the kit's protocol), never as Parley's EventFrame, so that a client
or a fuzzer generated from the spec reads them as what they are."""

from __future__ import annotations

import json

from app.api.kits import router
from app.main import create_app
from app.protocol.ag_ui import FRAME_SCHEMA as AG_UI_FRAME
from app.protocol.ai_sdk import FRAME_SCHEMA as AI_SDK_FRAME
from app.protocol.openapi import EVENT_FRAME, SCHEMAS, STREAM_MEDIA_TYPE
from app.settings import Settings

STREAMS = {
    ("post", "/v1/ai-sdk/chat"): AI_SDK_FRAME,
    ("get", "/v1/ai-sdk/chat/{chat_id}/stream"): AI_SDK_FRAME,
    ("post", "/v1/ag-ui"): AG_UI_FRAME,
}


def test_the_kit_streams_have_their_own_frame_schema() -> None:
    spec = create_app(Settings()).openapi()
    for (method, path), frame in STREAMS.items():
        operation = spec["paths"][path][method]
        assert operation["responses"]["200"]["content"][STREAM_MEDIA_TYPE]["schema"] == frame
        assert SCHEMAS + EVENT_FRAME not in json.dumps(operation)
        assert "x-endless-stream" not in operation  # each ends with its turn
    # Parley's own stream keeps its EventFrame.
    events = spec["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert events["responses"]["200"]["content"][STREAM_MEDIA_TYPE]["schema"]["$ref"].endswith(EVENT_FRAME)


def test_every_kit_route_is_in_the_spec() -> None:
    spec = create_app(Settings()).openapi()
    for route in router.routes:
        path = getattr(route, "path", "")
        assert path in spec["paths"], path
    assert spec["paths"]["/v1/ai-sdk/chat/{chat_id}/stream"]["get"]["responses"]["204"]
