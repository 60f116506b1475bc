"""The AI SDK's own `useChat` (@ai-sdk/react) on Parley, in a real page: the built example
(examples/ai-sdk-react/dist, `make examples`) in chromium, its /v1 proxied to a real server process, as its
vite dev server proxies them to `make run`'s. It chats with the demo model, shows a server tool's call, is
reloaded mid-answer and resumes without doubling a word, regenerates, answers an approval with the kit's own
response, and its session is the one Parley's own routes and page show; a build with a key sends it. The
page is read by polling from Python, as the other browser tests do.

Without the build the tests are skipped with one line; under CI=true that is a failure."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.browser import page as parley_page
from tests.browser.conftest import KEY
from tests.browser.example_server import serve_example
from tests.support.missing import missing
from tests.support.process import ServerProcess
from tests.support.server import migrate

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ai-sdk-react"
DIST = EXAMPLE / "dist"
AUTH = {"Authorization": f"Bearer {KEY}"}  # what the keyed server needs; a keyless one ignores it
T = TypeVar("T")

# Each message the page shows: its id and role, its text parts and its tool parts, in order.
SHOWN_JS = """() => [...document.querySelectorAll('#messages .message')].map(m => ({
  id: m.dataset.id,
  role: m.dataset.role,
  texts: [...m.querySelectorAll('.text')].map(p => p.textContent),
  reasoning: [...m.querySelectorAll('.reasoning')].map(p => p.textContent),
  tools: [...m.querySelectorAll('.tool')].map(t => ({
    name: t.querySelector('.tool-name').textContent,
    state: t.dataset.state,
    input: t.querySelector('.tool-input').textContent,
    output: t.querySelector('.tool-output')?.textContent ?? null,
  })),
}))"""


@dataclass(frozen=True)
class Tool:
    name: str
    state: str
    input: Any
    output: str | None


@dataclass(frozen=True)
class Message:
    id: str
    role: str
    texts: tuple[str, ...]
    reasoning: tuple[str, ...]
    tools: tuple[Tool, ...]


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """As the browser tests' server (`parley`, which has a key), without keys: as `make run` serves, which
    the example's default build is for."""
    directory = tmp_path_factory.mktemp("use-chat")
    database_url = f"sqlite+aiosqlite:///{directory / 'parley.db'}"
    migrate(database_url)
    env = {"PARLEY_DATABASE_URL": database_url, "PARLEY_DEMO_TOKEN_DELAY": "0.02"}
    server = ServerProcess(env, directory / "server.log")
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def example(keyless: ServerProcess) -> Iterator[str]:
    if not (DIST / "index.html").is_file():
        missing("useChat test skipped: examples/ai-sdk-react/dist is missing (make examples builds it)")
    with serve_example(DIST, keyless.base_url) as base_url:
        yield base_url


def open_example(browser: Any, base_url: str, chat: str | None = None) -> tuple[Any, str]:
    """A new tab on the example, on `chat` or else without a chat id (it makes one and keeps it in the URL),
    once useChat's resume on mount (GET .../stream) has found no turn."""
    page = browser.new_context(viewport={"width": 900, "height": 760}).new_page()
    page.on("pageerror", lambda error: print(f"page error: {error}"))
    with page.expect_response(is_resume) as resume:
        page.goto(f"{base_url}/" + (f"?chat={chat}" if chat else ""))
    assert resume.value.status == 204
    chat_id = page.evaluate("() => new URL(location.href).searchParams.get('chat')")
    assert chat_id
    return page, str(chat_id)


def is_resume(response: Any) -> bool:
    return response.request.method == "GET" and str(response.url).endswith("/stream")


def send(page: Any, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def shown(page: Any) -> list[Message]:
    return [
        Message(
            m["id"],
            m["role"],
            tuple(m["texts"]),
            tuple(m["reasoning"]),
            tuple(Tool(t["name"], t["state"], json.loads(t["input"]), t["output"]) for t in m["tools"]),
        )
        for m in page.evaluate(SHOWN_JS)
    ]


def stored(base_url: str, chat_id: str) -> list[Message]:
    """The chat as the kit loads it (GET /v1/ai-sdk/chat/{id}/messages), in the page's terms."""
    response = httpx.get(f"{base_url}/v1/ai-sdk/chat/{chat_id}/messages", headers=AUTH, timeout=30)
    response.raise_for_status()
    return [
        Message(
            m["id"],
            m["role"],
            tuple(p["text"] for p in m["parts"] if p["type"] == "text"),
            tuple(p["text"] for p in m["parts"] if p["type"] == "reasoning"),
            tuple(
                Tool(p["type"][5:], p["state"], p["input"], p.get("output", p.get("errorText")))
                for p in m["parts"]
                if p["type"].startswith("tool-")
            ),
        )
        for m in response.json()
    ]


def status(page: Any) -> str:
    return str(page.get_attribute("#status", "data-status"))


def until(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def settled(
    page: Any, base_url: str, chat_id: str, new: Callable[[list[Message]], bool] = lambda _: True
) -> list[Message]:
    """Waits until the turn has ended, useChat is ready and the page shows exactly the chat's stored
    history (and that history is `new`); returns it. A page that doubled or lost a part never gets there,
    and the assertion shows both sides. (useChat is `ready` before its resume request answers, and the
    session is known from the first chunks: a page just reloaded mid-answer is not settled.)"""
    seen: list[list[Message]] = [[], []]

    def same() -> list[Message] | None:
        session_id = page.get_attribute("#session-link", "data-session-id")
        if status(page) != "ready" or not session_id or not parley_page.session_idle(base_url, session_id):
            return None
        seen[:] = [shown(page), stored(base_url, chat_id)]
        return seen[0] if seen[0] == seen[1] and new(seen[0]) else None

    try:
        return until(same, "the page matches the history")
    except AssertionError as error:
        raise AssertionError(f"{error}\npage:    {seen[0]}\nhistory: {seen[1]}") from None


def session_of(page: Any) -> str:
    """The chat's Parley session, as the page learnt it from the `data-parley-session` part."""
    return str(until(lambda: page.get_attribute("#session-link", "data-session-id"), "the session is shown"))


def test_chat_a_server_tool_regenerate_and_the_same_session_on_parleys_page(
    browser: Any, keyless: ServerProcess, example: str, tmp_path: Path
) -> None:
    page, chat_id = open_example(browser, example)
    send(page, "[think] hello there")
    first = settled(page, keyless.base_url, chat_id)
    assert [m.role for m in first] == ["user", "assistant"] and first[0].texts == ("[think] hello there",)
    assert first[1].texts[0].startswith("You said: [think] hello there") and first[1].reasoning

    send(page, "what time is it?")
    answered = settled(page, keyless.base_url, chat_id)
    assert [m.role for m in answered] == ["user", "assistant", "user", "assistant"]
    (tool,) = answered[-1].tools
    assert tool.name == "current_time" and tool.state == "output-available"
    assert '"timezone": "UTC"' in (tool.output or "")
    assert answered[-1].texts[-1].startswith("The current time is")
    page.screenshot(path=str(tmp_path / "use-chat.png"))

    # The same session on Parley's own routes and its page, with the same text.
    session_id = session_of(page)
    transcript = [f"{m.role}: {text}" for m in answered for text in m.texts]
    assert parley_page.history_transcript(keyless.base_url, session_id) == transcript
    ui = parley_page.open_page(browser, keyless.base_url, key=None, session_id=session_id)
    assert parley_page.settled(ui, keyless.base_url, session_id) == transcript
    ui.context.close()

    # Regenerate: a new turn answers the last question again, in place of the old answer.
    page.click("#regenerate")
    regenerated = settled(page, keyless.base_url, chat_id, lambda now: now[-1].id != answered[-1].id)
    assert [m.id for m in regenerated[:3]] == [m.id for m in answered[:3]] and len(regenerated) == 4
    assert regenerated[-1].tools[0].name == "current_time"
    assert parley_page.history_transcript(keyless.base_url, session_id) == [
        f"{m.role}: {text}" for m in regenerated for text in m.texts
    ]
    page.context.close()


def test_a_reload_mid_answer_resumes_it_without_doubling(
    browser: Any, keyless: ServerProcess, example: str
) -> None:
    page, chat_id = open_example(browser, example)
    send(page, "[slow] hello there")
    until(
        lambda: status(page) == "streaming" and len(" ".join(shown(page)[-1].texts).split()) >= 3,
        "the answer's first words are shown",
    )
    with page.expect_response(is_resume) as resume:
        page.reload()
    assert resume.value.status == 200  # the reloaded page found the turn running, and follows it
    assert page.evaluate("() => new URL(location.href).searchParams.get('chat')") == chat_id
    final = settled(page, keyless.base_url, chat_id)
    assert [m.role for m in final] == ["user", "assistant"]
    (text,) = final[1].texts
    assert text.startswith("You said: [slow] hello there") and text.count("You said") == 1
    page.context.close()


def test_an_approval_answered_with_the_kits_own_response(
    browser: Any, keyless: ServerProcess, example: str
) -> None:
    created = httpx.post(f"{keyless.base_url}/v1/sessions", json={"approval": ["current_time"]}, timeout=30)
    session_id = created.json()["id"]
    page, chat_id = open_example(browser, example, chat=session_id)  # a session id names that session
    assert chat_id == session_id
    send(page, "what time is it?")
    page.wait_for_selector(".tool[data-state='approval-requested'] button.approve")
    assert parley_page.pending(keyless.base_url, session_id)[0]["kind"] == "approval"
    page.click(".tool[data-state='approval-requested'] button.approve")
    answered = settled(page, keyless.base_url, chat_id)
    (tool,) = answered[-1].tools
    assert tool.name == "current_time" and tool.state == "output-available"
    assert answered[-1].texts[-1].startswith("The current time is")
    decided = parley_page.history_rows(keyless.base_url, session_id, "tool_group")
    assert [row["decision"] for row in decided] == ["approve"]
    page.context.close()


def test_a_build_with_a_key_sends_it(browser: Any, parley: ServerProcess, tmp_path: Path) -> None:
    """VITE_PARLEY_API_KEY, read at build time, is the `Authorization` of every request the page makes:
    the history on mount, useChat's posts and resumes (against a server with keys, each would be a 401)."""
    if not (EXAMPLE / "node_modules" / ".bin" / "vite").exists():
        missing("useChat key test skipped: examples/ai-sdk-react/node_modules is missing (make examples)")
    built = tmp_path / "dist"
    subprocess.run(
        ["node_modules/.bin/vite", "build", "--outDir", str(built), "--emptyOutDir", "--logLevel", "error"],
        cwd=EXAMPLE,
        env={**os.environ, "VITE_PARLEY_API_KEY": KEY},
        check=True,
        timeout=240,
    )
    with serve_example(built, parley.base_url) as base_url:
        page, chat_id = open_example(browser, base_url)
        send(page, "hello there")
        answered = settled(page, parley.base_url, chat_id)
        assert [m.role for m in answered] == ["user", "assistant"]
        assert answered[1].texts[0].startswith("You said: hello there")
        page.context.close()
