"""The kits' own packages against a live server (clients/kits, `make kits-deps`): the AI SDK's
`DefaultChatTransport` (which validates every chunk with the package's own schema), `readUIMessageStream`
and, for approvals, `AbstractChat` (what useChat wraps), for the current major and the previous two, and
AG-UI's `HttpAgent` (which runs every event through the package's verifier). Each scenario is a Node
script that prints what it saw.

Without clients/kits/node_modules the module is skipped with one line; under CI=true that is a failure."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.protocol.ag_ui import CONTEXT_HEADING
from app.settings import Settings
from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.conftest import MODEL, write_models_file
from tests.interrupt.session import assert_strictly_valid, chat_requests
from tests.support.missing import missing
from tests.support.server import LiveServer, live_server

KITS = Path(__file__).resolve().parents[2] / "clients" / "kits"
AI_PACKAGES = ("ai", "ai-v6", "ai-v5")
# AG-UI's client 1.x, and 0.0.59 (what CopilotKit's runtime and React packages 1.7x pin).
AG_UI_PACKAGES = ("@ag-ui/client", "ag-ui-v0")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _kits_installed() -> None:
    if not (KITS / "node_modules").is_dir() or shutil.which("node") is None:
        missing("kit tests skipped: clients/kits/node_modules is missing (make kits-deps installs it)")


@pytest.fixture
def paced(database_url: str) -> Iterator[LiveServer]:
    """The demo model at its default pace, so that a turn lasts long enough to stop or to leave."""
    with live_server(Settings(database_url=database_url)) as server:
        yield server


def scenario(script: str, package: str, server: LiveServer, name: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", f"scenarios/{script}", package, server.base_url, name, *extra],
        cwd=KITS,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("package", AI_PACKAGES)
def test_ai_sdk_text_and_a_server_tool(server: LiveServer, package: str) -> None:
    seen = scenario("ai-sdk.mjs", package, server, "text")
    assert seen["major"] == {"ai": 7, "ai-v6": 6, "ai-v5": 5}[package]
    assert seen["finish"]["finishReason"] == "stop"
    parts = seen["message"]["parts"]
    tool = next(p for p in parts if p["type"] == "tool-current_time")
    assert tool["state"] == "output-available" and '"timezone": "UTC"' in tool["output"]
    assert [p["text"] for p in parts if p["type"] == "text"][-1].startswith("The current time is")
    # What the kit built from the stream is what the chat's history gives a reloaded page.
    assert seen["history"][-1] == seen["message"]
    assert seen["idleResume"] is None


@pytest.mark.parametrize("package", AI_PACKAGES)
def test_ai_sdk_browser_side_tool_answered_by_the_kit(server: LiveServer, package: str) -> None:
    seen = scenario("ai-sdk.mjs", package, server, "client-tool")
    assert seen["firstFinish"]["finishReason"] == "tool-calls"
    assert seen["call"]["state"] == "input-available" and seen["call"]["input"] == {"precise": True}
    assert seen["secondTypes"][0] == "start" and seen["secondTypes"][-1] == "finish"
    texts = [p["text"] for p in seen["message"]["parts"] if p["type"] == "text"]
    assert texts[-1] == 'The get_location tool returned: {"city": "Lisbon"}.'


@pytest.mark.parametrize("package", AI_PACKAGES)
def test_ai_sdk_stop_is_an_abort(paced: LiveServer, package: str) -> None:
    seen = scenario("ai-sdk.mjs", package, paced, "stop")
    assert seen["cancelStatus"] == 202
    assert seen["types"][-1] == "abort" and "finish" not in seen["types"]


@pytest.mark.parametrize("package", AI_PACKAGES)
def test_ai_sdk_reload_mid_answer_resumes(paced: LiveServer, package: str) -> None:
    seen = scenario("ai-sdk.mjs", package, paced, "resume")
    assert "finish" not in seen["before"]
    assert seen["types"][0] == "start" and seen["types"][-1] == "finish"
    assert seen["message"] == seen["history"][-1]
    assert seen["after"] is None


@pytest.mark.parametrize("package", AI_PACKAGES)
def test_ai_sdk_approval_with_the_kits_own_flow_from_major_6(server: LiveServer, package: str) -> None:
    created = httpx.post(f"{server.base_url}/v1/sessions", json={"approval": ["current_time"]}, timeout=10)
    session_id = created.json()["id"]
    seen = scenario("ai-sdk.mjs", package, server, "approval", session_id)
    assert seen["errors"] == []
    tool = next(p for p in seen["message"]["parts"] if p["type"] == "tool-current_time")
    assert tool["state"] == "output-available"
    assert [p["text"] for p in seen["message"]["parts"] if p["type"] == "text"][-1].startswith(
        "The current time is"
    )
    if seen["major"] == 5:
        # No approval flow in the kit: one answer, held open until Parley's own route approves.
        assert seen["routeStatus"] == 200
        (answer,) = seen["answers"]
        assert "tool-approval-request" not in answer and answer[-1] == "finish"
        assert seen["asked"]["state"] == "output-available"
    else:
        # The first answer ends at the request; the kit's response continues the same message.
        asked, then = seen["answers"]
        assert "tool-approval-request" in asked and asked[-2:] == ["finish-step", "finish"]
        assert seen["asked"]["state"] == "approval-requested"
        assert seen["asked"]["approval"]["id"] == seen["asked"]["toolCallId"]
        (sent,) = seen["continuation"]
        assert sent["trigger"] == "submit-message" and sent["messageId"] == seen["message"]["id"]
        assert sent["last"]["parts"][-1]["state"] == "approval-responded"
        assert then[0] == "start" and "tool-output-available" in then and then[-1] == "finish"
        assert tool["approval"] == {"id": tool["toolCallId"], "approved": True}
    history = httpx.get(f"{server.base_url}/v1/sessions/{session_id}/messages", timeout=10).json()
    decided = next(m for m in history["chat_messages"] if m["type"] == "tool_group")
    assert decided["decision"] == "approve"


@pytest.mark.parametrize("package", AG_UI_PACKAGES)
def test_ag_ui_run_with_text_and_a_tool_then_an_attach(server: LiveServer, package: str) -> None:
    seen = scenario("ag-ui.mjs", package, server, "text")
    assert seen["types"][0] == "RUN_STARTED" and seen["types"][-1] == "RUN_FINISHED"
    assert {"STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_RESULT", "TEXT_MESSAGE_CONTENT"} <= set(
        seen["types"]
    )
    roles = [m["role"] for m in seen["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert seen["messages"][1]["toolCalls"][0]["function"]["name"] == "current_time"
    assert seen["attachTypes"] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert seen["attachMessages"] == seen["messages"]


@pytest.mark.parametrize("package", AG_UI_PACKAGES)
def test_ag_ui_frontend_tool(server: LiveServer, package: str) -> None:
    seen = scenario("ag-ui.mjs", package, server, "frontend-tool")
    # A client before 1.0 declares no protocolVersion, and its schema has no pendingToolCallIds.
    pending = {"pendingToolCallIds": [seen["call"]["id"]]} if package == "@ag-ui/client" else {}
    assert seen["finished"]["outcome"] == {"type": "success", **pending}
    assert seen["call"]["function"]["name"] == "get_location"
    assert seen["messages"][-1]["content"] == 'The get_location tool returned: {"city": "Lisbon"}.'


@pytest.mark.parametrize("package", AG_UI_PACKAGES)
def test_ag_ui_approval_interrupt_resumed_by_the_next_run(server: LiveServer, package: str) -> None:
    created = httpx.post(f"{server.base_url}/v1/sessions", json={"approval": ["current_time"]}, timeout=10)
    session_id = created.json()["id"]
    seen = scenario("ag-ui.mjs", package, server, "approval", session_id)
    assert seen["threadId"] == session_id
    interrupt = seen["finished"]["outcome"]["interrupts"][0]
    assert interrupt["reason"] == "tool_approval" and interrupt["toolCallId"] == interrupt["id"]
    assert seen["secondTypes"][-1] == "RUN_FINISHED"
    assert seen["messages"][-1]["content"].startswith("The current time is")
    history = httpx.get(f"{server.base_url}/v1/sessions/{session_id}/messages", timeout=10).json()
    tool = next(m for m in history["chat_messages"] if m["type"] == "tool_group")
    assert tool["decision"] == "approve"


@pytest.fixture
def strict_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(strict=True) as running:
        yield running


@pytest.fixture
def strict_server(settings: Settings, strict_upstream: FakeUpstream, tmp_path: Path) -> Iterator[LiveServer]:
    models = write_models_file(tmp_path, strict_upstream.base_url)
    with live_server(settings.model_copy(update={"models_file": models, "default_model": MODEL})) as running:
        yield running


@pytest.mark.parametrize("package", AG_UI_PACKAGES)
def test_ag_ui_context_reaches_the_model_and_state_is_kept(
    strict_server: LiveServer, strict_upstream: FakeUpstream, package: str
) -> None:
    strict_upstream.enqueue(Script.text("Call Ana."))
    seen = scenario("ag-ui.mjs", package, strict_server, "context")
    assert seen["types"][:2] == ["RUN_STARTED", "STATE_SNAPSHOT"] and seen["types"][-1] == "RUN_FINISHED"
    assert seen["snapshot"] == seen["state"] == {"todos": [{"title": "call Ana", "done": False}]}
    assert seen["messages"][-1]["content"] == "Call Ana."
    (request,) = chat_requests(strict_upstream)
    system, asked = request.body["messages"]
    assert system["role"] == "system" and system["content"].startswith(CONTEXT_HEADING)
    assert '- The user\'s todo list: [{"title":"call Ana"}]' in system["content"]
    assert asked == {"role": "user", "content": "what is left to do?"}
    assert_strictly_valid(strict_upstream)
