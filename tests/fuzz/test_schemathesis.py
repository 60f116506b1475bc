"""Schemathesis against the app's own OpenAPI spec, over a real socket: no server error, every answer is one
the spec documents (status code, content type, headers and body schema), data the spec calls valid is
accepted and data it calls invalid is refused, and authentication is never ignored.

Three runs, each bounded: the fixed seed (FIXED_SEED, the same cases every time), a fresh random seed
(another one each run, printed in the report header and in every failure, so that
`PARLEY_FUZZ_SEED=<seed> pytest tests/fuzz` replays it), and the stateful phase with that seed, which
follows the spec's links (create a session -> post a message -> get its turn, withdraw it, read the
stream...) and also checks that a deleted session stays deleted. Per operation the first two run the
coverage phase's boundary and negative cases (missing and wrong-typed fields, undeclared methods, requests
without the key), then MAX_EXAMPLES fuzzed cases, valid and invalid.

What the spec cannot say in JSON Schema, the harness does as a client that read the descriptions would:

* References to server-side things a schema cannot list are pointed at real ones in valid cases: a path's
  session is a real session of the caller (read-only operations get one with a finished turn, the others a
  new one each, so no case depends on what an earlier one changed), a `turn_id` or `message_id` a real one,
  a `model` (AG-UI's `forwardedProps.parley.model` too) the demo model, `tools` real tool names, a cursor
  (`cursor`, `after`, `before`) a real one.
  Invalid cases keep what was generated: the server must refuse them anyway.
* Client tool names (`client_tools`, and AG-UI's `tools` objects) are unique and none is a server tool's
  name; an approval rule names the session's server tools (`"*"` where it has none).
* `timeout` is valid only with `wait=true` (its description says so; the server answers 422
  `wait_required`): a valid case with a timeout gets `wait=true`.
* An Idempotency-Key is per request: a valid case's key gets a suffix naming its path and body, so that a
  key the generator reuses with another body (a documented 422) does not read as valid data refused.
* A file's type is read from its bytes, which no schema can state: a valid upload's `file` is a real
  PNG, a valid message's `attachments` name a real file of the caller, and a path's `file_id` is a real
  file (a new one for a DELETE).
* The event stream never ends by itself: every run asks for `until_idle=true` (unless the case is about
  an invalid `until_idle`), which ends the stream once the session is idle and the stream has caught up,
  as a generic client that wants an end must; at most MAX_STREAM_EVENTS events are read in any case.

Valid data may be refused with the statuses whose causes no schema can state: 404 (a deleted or unknown
session), 409 (a turn took the message), 410 (a replay of a deleted session's creation), 413 (a body past
PARLEY_MAX_BODY_BYTES, a message past PARLEY_MAX_MESSAGE_CHARS), 429 and 5xx (limits and outages; 5xx is
still caught by not_a_server_error, except the documented 504 of a wait). Invalid data may also be
refused with 413 or 431 (too large), besides schemathesis's default list of refusals.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ensure_resource_availability,
    ignored_auth,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
    use_after_free,
)

from app.main import create_app
from app.settings import Settings
from tests.support.server import LiveServer, live_server, migrate

FIXED_SEED = 20261122
FRESH_SEED = int(os.environ.get("PARLEY_FUZZ_SEED") or secrets.randbelow(2**32))
REPLAY = f"replay this run's fresh seed with: PARLEY_FUZZ_SEED={FRESH_SEED} pytest tests/fuzz"
MAX_EXAMPLES = 20
STATEFUL_EXAMPLES = 10
STATEFUL_STEPS = 8
MAX_STREAM_EVENTS = 3
KEY = "fuzz-key-000000000000000000000000"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHECKS: list[Callable[..., Any]] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    positive_data_acceptance,
    negative_data_rejection,
    ignored_auth,
    unsupported_method,
    allow_header_conformance,
]
STATEFUL_CHECKS = [*CHECKS, use_after_free, ensure_resource_availability]


def _config(seed: int) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": seed,
            # The caller's key, known to the generator: valid cases carry it (a session header alone is
            # overridden by the Authorization the generator makes up, so valid cases read as 401s), and
            # the cases about authentication (missing or wrong key, ignored_auth) still leave it out.
            "auth": {"openapi": {"ApiKey": {"bearer": KEY}, "AccessToken": {"api_key": KEY}}},
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "phases": {"stateful": {"enabled": True, "max-steps": STATEFUL_STEPS}},
            "max-stream-events": MAX_STREAM_EVENTS,
            "request-timeout": 10,
            "checks": {
                # A wait past its limit (a fuzzed `timeout=5e-324`) answers the documented 504
                # `wait_timeout`; status_code_conformance and response_schema_conformance still hold it.
                "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "504"]},
                "positive_data_acceptance": {
                    "expected-statuses": ["2xx", "401", "403", "404", "409", "410", "413", "429", "5xx"]
                },
                # Refusals the defaults leave out: an invalid request may also be too large (a 100,000
                # character system_prompt of escaped astral characters is 1.2 MB of JSON).
                "negative_data_rejection": {
                    "expected-statuses": [
                        *("400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428"),
                        *("429", "431", "5xx"),
                    ]
                },
            },
        }
    )


SPEC = create_app(Settings()).openapi()
fixed = schemathesis.openapi.from_dict(copy.deepcopy(SPEC), config=_config(FIXED_SEED))
fresh = schemathesis.openapi.from_dict(copy.deepcopy(SPEC), config=_config(FRESH_SEED))

READ_ONLY = {"GET", "HEAD"}
DEMO_MODEL = "parley/demo"
# A 2x1 PNG: what a valid upload sends (any bytes of another type are a documented 415).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAIAAAB7QOjdAAAAD0lEQVR4nGP8z8DAwMAAAAYIAQHLR3Z1AAAAAElFTkSuQmCC"
)


class Target:
    """The live server, the caller's key, and real things for the references the generator cannot know."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        # The harness's own requests carry the key; the cases' carry what the generator gave them (the
        # key, configured in _config, or none or a wrong one where authentication is what is tested).
        self.http = requests.Session()
        self.http.headers.update(AUTH)
        self.cases = requests.Session()
        self._ready()
        self.history_session = self._new_session()
        self.turn_id, self.message_id = self._finished_turn(self.history_session)
        self._new_session()
        page = self.http.get(f"{server.base_url}/v1/sessions", params={"limit": 1}, timeout=10).json()
        self.cursor: str = page["next_cursor"]
        tools = self.http.get(f"{server.base_url}/v1/sessions/{self.history_session}", timeout=10).json()
        self.tools: list[str] = tools["tools"]
        self.file_id = self._new_file()

    def _new_file(self) -> str:
        """A file of the caller: a PNG made unique by bytes after its end (the same bytes are one file)."""
        data = PNG + secrets.token_bytes(8)
        uploaded = self.http.post(
            f"{self.server.base_url}/v1/files", files={"file": ("f.png", data)}, timeout=10
        )
        assert uploaded.status_code == 201, uploaded.text
        file_id: str = uploaded.json()["id"]
        return file_id

    def _ready(self) -> None:
        """Until the model layer has loaded (seconds on a busy machine), the first request waits for it:
        cases must not spend their request timeout on that."""
        deadline = time.monotonic() + 120
        while self.http.get(f"{self.server.base_url}/readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the model layer did not load"
            time.sleep(0.1)

    def _new_session(self) -> str:
        created = self.http.post(f"{self.server.base_url}/v1/sessions", json={}, timeout=10)
        assert created.status_code == 201, created.text
        session_id: str = created.json()["id"]
        return session_id

    def _finished_turn(self, session_id: str) -> tuple[str, str]:
        url = f"{self.server.base_url}/v1/sessions/{session_id}"
        posted = self.http.post(f"{url}/messages", json={"content": "what time is it?"}, timeout=10)
        assert posted.status_code == 202, posted.text
        deadline = time.monotonic() + 30
        while self.http.get(url, timeout=10).json()["agent_status"] != "idle":
            assert time.monotonic() < deadline, "the demo turn did not finish"
            time.sleep(0.05)
        accepted: dict[str, Any] = posted.json()
        return accepted["turn_id"], accepted["id"]

    def prepare(self, case: Case[Any]) -> None:
        """A case of the seeded runs: real sessions in the path, then `_references`."""
        params = case.path_parameters
        if params is not None and "session_id" in params:
            if case.method.upper() in READ_ONLY:
                params["session_id"] = self.history_session
            else:
                params["session_id"] = self._new_session()
            if "turn_id" in params:
                params["turn_id"] = self.turn_id
            if "file_id" in params:
                params["file_id"] = self._new_file() if case.method.upper() == "DELETE" else self.file_id
            if "message_id" in params:
                # A message the finished turn took: withdrawing it is a 409 and changes nothing.
                params["session_id"] = self.history_session
                params["message_id"] = self.message_id
        self._references(case)

    def prepare_stateful(self, case: Case[Any]) -> None:
        """A step of the stateful run: its path comes from the links (or is generated)."""
        self._references(case)

    @staticmethod
    def _until_idle(case: Case[Any]) -> None:
        """Valid stream requests ask for an end; invalid ones too, unless until_idle is what is invalid."""
        if not case.path.endswith("/events"):
            return
        query = case.query if case.query is not None else {}
        if case.meta is not None and case.meta.generation.mode.is_positive:
            query["until_idle"] = "true"
        else:
            query.setdefault("until_idle", "true")
        case.query = query

    def _tool_rules(self, body: dict[str, Any]) -> None:
        """Client tool names unique and none a server tool's, and their parameters valid JSON Schemas (their
        descriptions say so: a generator drawing any object can write `{"if": [null]}`); an approval rule
        names the session's server tools (a reference, as `tools` is)."""
        # A session's or a message's `client_tools`, and AG-UI's `tools` (a list of objects): the same rules.
        objects = body.get("tools")
        client = body.get("client_tools", objects if isinstance(objects, list) else None)
        if isinstance(client, list):
            taken = set(self.tools)
            for n, tool in enumerate(client):
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    while tool["name"] in taken:
                        tool["name"] = f"client_{n}_{len(taken)}"
                    taken.add(tool["name"])
                if isinstance(tool, dict) and isinstance(tool.get("parameters"), dict):
                    try:
                        Draft202012Validator.check_schema(tool["parameters"])  # as the service checks it
                    except SchemaError:
                        tool["parameters"] = {"type": "object", "properties": {}}
        rule = body.get("approval")
        named = body.get("tools")
        available = named if isinstance(named, list) else self.tools
        if isinstance(rule, list):
            body["approval"] = [available[n % len(available)] if available else "*" for n in range(len(rule))]
        elif isinstance(rule, dict) and rule:
            names = list(dict.fromkeys(available)) or ["*"]
            body["approval"] = {names[n % len(names)]: when for n, when in enumerate(rule.values())}

    def _files(self, case: Case[Any]) -> None:
        """A valid upload sends a real PNG; valid attachments name the caller's file; the AI SDK's valid
        file parts are PNGs."""
        body: Any = case.body
        if not isinstance(body, dict):
            return
        if case.path == "/v1/files" and "file" in body:
            body["file"] = PNG
        attachments = body.get("attachments")
        if isinstance(attachments, list):
            body["attachments"] = [{"file_id": self.file_id} for _ in attachments]
        # The AI SDK's file parts are data URLs: a valid one holds a file of an accepted type.
        for message in body.get("messages") or []:
            for part in message.get("parts") or [] if isinstance(message, dict) else []:
                if isinstance(part, dict) and part.get("type") == "file" and "url" in part:
                    part["url"] = "data:image/png;base64," + base64.b64encode(PNG).decode()
                    part["mediaType"] = "image/png"

    @staticmethod
    def _multipart_types(case: Case[Any]) -> None:
        """A form sends text: an invalid upload whose `purpose` is a number or a boolean arrives as its text,
        which is valid. Such a case is made invalid as the server can tell: too long a purpose."""
        body: Any = case.body
        purpose = body.get("purpose") if isinstance(body, dict) else None
        if case.path == "/v1/files" and purpose is not None and not isinstance(purpose, str):
            body["purpose"] = "x" * 65

    def _references(self, case: Case[Any]) -> None:
        self._until_idle(case)
        if case.meta is None or not case.meta.generation.mode.is_positive:
            self._multipart_types(case)
            return
        query = case.query if case.query is not None else {}
        in_history = (case.path_parameters or {}).get("session_id") == self.history_session
        if "cursor" in query:
            query["cursor"] = self.cursor
        for name in ("after", "before"):
            if name in query and not case.path.endswith("/events"):
                real = self.turn_id if case.path.endswith("/turns") else self.message_id
                if in_history:
                    query[name] = real
                else:
                    del query[name]
        if "timeout" in query:
            query["wait"] = "true"
        self._files(case)
        if isinstance(case.body, dict):
            if isinstance(case.body.get("model"), str):
                case.body["model"] = DEMO_MODEL
            # AG-UI's forwardedProps.parley.model names a model as a session's `model` does.
            props = case.body.get("forwardedProps")
            parley = props.get("parley") if isinstance(props, dict) else None
            if isinstance(parley, dict) and isinstance(parley.get("model"), str):
                parley["model"] = DEMO_MODEL
            tools = case.body.get("tools")
            # A list of names names server tools (a session's `tools`); AG-UI's `tools` are objects, the
            # frontend's own.
            if isinstance(tools, list) and all(isinstance(tool, str) for tool in tools):
                case.body["tools"] = [self.tools[n % len(self.tools)] for n in range(len(tools))]
            self._tool_rules(case.body)
        headers = case.headers if case.headers is not None else {}
        key = headers.get("Idempotency-Key")
        if isinstance(key, str):
            path = case.formatted_path
            digest = hashlib.sha256(json.dumps([path, case.body], default=str).encode()).hexdigest()[:16]
            headers["Idempotency-Key"] = f"{key[:200]}~{digest}"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    database: Path = tmp_path_factory.mktemp("fuzz") / "parley.db"
    url = f"sqlite+aiosqlite:///{database}"
    migrate(url)
    settings = Settings(
        database_url=url,
        api_keys=f"fuzz:{KEY}",
        demo_token_delay=0.0,
        provider_retry_backoff=0.01,
        messages_per_minute=0,  # thousands of posts: the rate limit has its own tests
    )
    with live_server(settings) as server:
        fuzz_target = Target(server)
        yield fuzz_target
        fuzz_target.http.close()
        fuzz_target.cases.close()


def _call(case: Case[Any], target: Target) -> None:
    target.prepare(case)
    case.call_and_validate(base_url=target.server.base_url, session=target.cases, checks=CHECKS, timeout=10.0)


@fixed.parametrize()
def test_fixed_seed_no_server_error_and_every_answer_is_documented(case: Case[Any], target: Target) -> None:
    _call(case, target)


@fresh.parametrize()
def test_fresh_seed_no_server_error_and_every_answer_is_documented(case: Case[Any], target: Target) -> None:
    try:
        _call(case, target)
    except BaseException as failure:
        failure.add_note(REPLAY)
        raise


def test_stateful_links_chain_operations(target: Target) -> None:
    class Workflow(fresh.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Case[Any]) -> None:
            target.prepare_stateful(case)

        def get_call_kwargs(self, case: Case[Any]) -> dict[str, Any]:
            return {"base_url": target.server.base_url, "session": target.cases, "timeout": 10.0}

        def validate_response(self, response: Any, case: Case[Any], **kwargs: Any) -> None:
            kwargs.pop("additional_checks", None)
            case.validate_response(response, checks=STATEFUL_CHECKS, transport_kwargs=kwargs)

    hypothesis.seed(FRESH_SEED)(Workflow)
    try:
        Workflow.run(
            settings=hypothesis.settings(
                max_examples=STATEFUL_EXAMPLES,
                stateful_step_count=STATEFUL_STEPS,
                deadline=None,
                database=None,
                suppress_health_check=list(hypothesis.HealthCheck),
            )
        )
    except BaseException as failure:
        failure.add_note(REPLAY)
        raise
