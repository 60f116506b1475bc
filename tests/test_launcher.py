"""`python -m app`: refuses to serve without keys beyond loopback, and its access log never shows a key."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from tests.support.keys import EVERY_CHARACTER_KEY, key_pieces_in
from tests.support.server import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.processes]

KEY = "launcher-key-0123456789abcdef"


def _env(database_url: str, **extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    return {**kept, "PYTHONUNBUFFERED": "1", "PARLEY_DATABASE_URL": database_url, **extra}


def _launch(env: dict[str, str], host: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app", "--host", host, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextmanager
def launched(env: dict[str, str], host: str, log: Path) -> Iterator[str]:
    """The launcher serving on `host`; yields the loopback URL to reach it by."""
    port = free_port()
    process = _launch(env, host, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"the launcher exited:\n{log.read_text()}"
            try:
                # Serving: the model layer may still load (readyz), which none of these requests needs.
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready:\n{log.read_text()}"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_without_keys_it_refuses_a_non_loopback_address_and_says_what_to_set(
    database_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "--host", "0.0.0.0", "--port", str(free_port())],
        cwd=ROOT,
        env=_env(database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    for advice in (
        "refusing to start",
        "0.0.0.0",
        "PARLEY_API_KEYS=",
        "PARLEY_API_KEYS_FILE",
        "PARLEY_ALLOW_OPEN=1",
    ):
        assert advice in done.stderr, done.stderr
    assert "Uvicorn running" not in done.stderr + done.stdout


def test_an_unusable_keys_file_stops_it_before_it_binds(database_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "--port", str(free_port())],
        cwd=ROOT,
        env=_env(database_url, PARLEY_API_KEYS_FILE=str(tmp_path / "missing.json")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "PARLEY_API_KEYS_FILE" in done.stderr and "cannot be read" in done.stderr


def test_with_allow_open_it_serves_everyone_beyond_loopback(database_url: str, tmp_path: Path) -> None:
    with launched(_env(database_url, PARLEY_ALLOW_OPEN="1"), "0.0.0.0", tmp_path / "open.log") as url:
        assert httpx.post(f"{url}/v1/sessions", json={}, timeout=10).status_code == 201


def test_on_loopback_it_serves_without_keys(database_url: str, tmp_path: Path) -> None:
    with launched(_env(database_url), "127.0.0.1", tmp_path / "local.log") as url:
        assert httpx.post(f"{url}/v1/sessions", json={}, timeout=10).status_code == 201


def test_with_keys_it_serves_beyond_loopback_and_the_access_log_hides_the_access_token(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "keyed.log"
    with launched(_env(database_url, PARLEY_API_KEYS=f"alice:{KEY}"), "0.0.0.0", log) as url:
        auth = {"Authorization": f"Bearer {KEY}"}
        sid = httpx.post(f"{url}/v1/sessions", json={}, headers=auth, timeout=10).json()["id"]
        with httpx.stream(
            "GET", f"{url}/v1/sessions/{sid}/events", params={"after": "0", "access_token": KEY}, timeout=10
        ) as stream:
            assert stream.status_code == 200
        refused = httpx.get(f"{url}/v1/sessions", params={"access_token": KEY}, timeout=10)
        assert refused.status_code == 401
        time.sleep(0.2)  # the access log line of the closed stream
    logged = log.read_text()
    # Redacted by app.observability.access_log (litellm, once loaded, adds a filter that may reword it).
    assert f"GET /v1/sessions/{sid}/events?after=0&" in logged, logged
    assert "GET /v1/sessions?" in logged, logged
    assert KEY not in logged


def _status_of_raw_get(url: str, target: str) -> int:
    """The status of a GET of `target` sent byte for byte, as curl sends a URL typed on its command line (no
    percent-encoding); the response, a stream perhaps, is left unread."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        received = b""
        while b"\r\n" not in received:
            chunk = conn.recv(4096)
            assert chunk, f"no answer to {target}"
            received += chunk
    return int(received.split(b" ", 2)[1])


def _until_ready(url: str, log: Path) -> None:
    """Until the model layer has loaded: litellm then is imported and its own filter is on uvicorn.access."""
    deadline = time.monotonic() + 120  # litellm's import takes seconds, more on a busy machine
    while httpx.get(f"{url}/readyz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, f"the model layer did not load:\n{log.read_text()}"
        time.sleep(0.1)


def test_a_key_of_every_allowed_character_works_in_the_url_and_no_log_line_shows_a_piece_of_it(
    database_url: str, tmp_path: Path
) -> None:
    """As typed (curl), percent-encoded (encodeURIComponent, httpx), under an encoded name: the stream
    authenticates, and neither the access log nor the error log shows 6 characters of the key (the
    service's own redaction: LiteLLM, whose logging filter once ran too, is not imported without a tail
    model); `after=` and `format=` stay readable."""
    key = EVERY_CHARACTER_KEY
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"bob": [f"bob-key-{'0' * 16}", key[::-1]]}))
    env = _env(database_url, PARLEY_API_KEYS=f"alice:{key}", PARLEY_API_KEYS_FILE=str(keys_file))
    log = tmp_path / "every.log"
    # (parameter name, key as sent, status): bob's key is valid, the session is alice's.
    sent = [
        ("access_token", key, 200),
        ("access_token", quote(key, safe=""), 200),
        ("access%5Ftoken", key, 200),
        ("access_token", key[::-1], 404),
        ("access_token", quote(key[::-1], safe=""), 404),
    ]
    with launched(env, "0.0.0.0", log) as url:
        _until_ready(url, log)
        created = httpx.post(
            f"{url}/v1/sessions", json={}, headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert created.status_code == 201
        for name, value, status in sent:
            target = f"/v1/sessions/{created.json()['id']}/events?after=0&{name}={value}&format=ndjson"
            assert _status_of_raw_get(url, target) == status, target
        # Where the key is not taken from the URL: 401, and still no piece of it in the log.
        assert _status_of_raw_get(url, f"/v1/sessions?access_token={key}&limit=5") == 401
        time.sleep(0.2)  # the access log lines of the streams
    logged = log.read_text()
    assert key_pieces_in(logged, key) == [], logged
    assert key_pieces_in(logged, key[::-1]) == [], logged
    streams = [line for line in logged.splitlines() if "/events?" in line]
    assert len(streams) == len(sent), logged
    for line in streams:
        assert "?after=0&" in line and "&format=ndjson HTTP/1.1" in line, line
    assert "GET /v1/sessions?" in logged and "&limit=5 HTTP/1.1" in logged, logged


def test_a_key_that_would_not_travel_unchanged_in_a_url_stops_it_with_the_rule(database_url: str) -> None:
    key = "launcher-key-+0123456789abcdef"  # `+`, as in standard base64: a space in a URL's query
    done = subprocess.run(
        [sys.executable, "-m", "app", "--port", str(free_port())],
        cwd=ROOT,
        env=_env(database_url, PARLEY_API_KEYS=f"alice:{KEY},bob:{key}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("parley: PARLEY_API_KEYS entry 2: the key of 'bob' must"), line
    assert "&, #, + or %" in line, line
    assert key_pieces_in(line, key) == [] and key_pieces_in(line, KEY) == [], line


@pytest.mark.parametrize(
    ("update", "loopback_only"),
    [({}, True), ({"allow_open": True}, False), ({"api_keys": f"alice:{KEY}"}, False)],
)
def test_the_app_itself_refuses_keyless_requests_beyond_loopback_unless_allowed(
    update: dict[str, object], loopback_only: bool
) -> None:
    """For a server started without the launcher (`uvicorn app.main:app --host 0.0.0.0`)."""
    app = create_app(Settings().model_copy(update=update))
    [middleware] = [m for m in app.user_middleware if "loopback_only" in m.kwargs]
    assert middleware.kwargs["loopback_only"] is loopback_only
