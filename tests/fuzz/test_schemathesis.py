"""Schemathesis against the app's own OpenAPI spec, over a real socket: no server error, and every answer is
one the spec documents (status code, content type, headers and body schema), and authentication is
never ignored.

Deterministic and bounded: a fixed seed, derandomized generation and no example database. Per operation:
the coverage phase's boundary and negative cases (missing and wrong-typed fields, undeclared methods,
requests without the key), then MAX_EXAMPLES fuzzed cases, valid and invalid; the stateful phase is off.
The checks also include unsupported_method (405 with an Allow header) and ignored_auth (each request is
sent again without the key and must get 401). About 25 seconds.

Path parameters naming a session are pointed at real sessions of the caller, or every case would stop at
the 404: read-only operations get a session with a finished turn (its history, turns and event log), the
others a new session each, so no case depends on what an earlier one changed. The event stream is fuzzed
too: a stream never ends, so schemathesis reads at most MAX_STREAM_EVENTS events, or for as long as the
stream's request timeout, then checks each frame against `EventFrame` and its data against `Event`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from app.main import create_app
from app.settings import Settings
from tests.support.server import LiveServer, live_server, migrate

SEED = 20261122
MAX_EXAMPLES = 40
MAX_STREAM_EVENTS = 3
STREAM_TIMEOUT = 0.25
KEY = "fuzz-key-000000000000000000000000"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
    unsupported_method,
    allow_header_conformance,
]

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "max-stream-events": MAX_STREAM_EVENTS,
        "request-timeout": 10,
        # A wait past its limit (a fuzzed `timeout=5e-324`) answers the documented 504 `wait_timeout`;
        # status_code_conformance and response_schema_conformance still hold it to the spec.
        "checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "504"]}},
    }
)
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi(), config=CONFIG)

READ_ONLY = {"GET", "HEAD"}


class Target:
    """The live server, the caller's key, and real sessions for the path parameters."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.http = requests.Session()
        self.http.headers.update(AUTH)
        self.history_session = self._new_session()
        self.turn_id, self.message_id = self._finished_turn(self.history_session)

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
        params = case.path_parameters
        if params is None or "session_id" not in params:
            return
        if case.method.upper() in READ_ONLY:
            params["session_id"] = self.history_session
        else:
            params["session_id"] = self._new_session()
        if "turn_id" in params:
            params["turn_id"] = self.turn_id
        if "message_id" in params:
            # A message the finished turn took: withdrawing it is a 409 and changes nothing.
            params["session_id"] = self.history_session
            params["message_id"] = self.message_id

    def timeout(self, case: Case[Any]) -> float:
        return STREAM_TIMEOUT if case.path.endswith("/events") else 10.0


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


@schema.parametrize()
def test_no_server_error_and_every_answer_is_documented(case: Case[Any], target: Target) -> None:
    target.prepare(case)
    case.call_and_validate(
        base_url=target.server.base_url,
        session=target.http,
        checks=CHECKS,
        timeout=target.timeout(case),
    )
