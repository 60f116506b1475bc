"""`python -m app` explains its configuration: each bad configuration gives its one line and a non-zero
exit, a good one one startup line; logs come in the human or the JSON format, the service's own lines
(a 4xx's) included; `.env` is read; inside a container the keyless refusal gives a container's advice.
How it proves it: the launcher runs as a real subprocess and its exit code and output are read."""

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

import httpx
import pytest

from app.llm.checks import missing_keys
from app.llm.models_file import ModelCatalog
from app.settings import Settings
from app.startup import container_advice, describe
from tests.support.server import ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.processes]


def _env(database_url: str, **extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OTEL_"))}
    kept.pop("container", None)
    return {**kept, "PYTHONUNBUFFERED": "1", "PARLEY_DATABASE_URL": database_url, **extra}


def _run(
    env: dict[str, str], *args: str, cwd: Path = ROOT, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "--port", str(free_port()), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _models(tmp_path: Path, providers: dict[str, object]) -> Path:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"providers": providers}), encoding="utf-8")
    return path


@contextmanager
def serving(env: dict[str, str], log: Path, cwd: Path = ROOT) -> Iterator[str]:
    port = free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port)], cwd=cwd, env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"the launcher exited:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_missing_models_file_is_one_line(database_url: str, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    done = _run(_env(database_url, PARLEY_MODELS_FILE=str(missing)))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(missing) in lines[0] and "PARLEY_MODELS_FILE" in lines[0]


def test_a_model_litellm_cannot_route_stops_the_server_with_the_fix(
    database_url: str, tmp_path: Path
) -> None:
    models = _models(tmp_path, {"local": {"api_base": "http://127.0.0.1:9/v1", "models": ["fake-model"]}})
    done = _run(_env(database_url, PARLEY_MODELS_FILE=str(models)))
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("parley: models file")]
    assert "'fake-model'" in line and "'openai/fake-model'" in line and "'local'" in line
    assert "Traceback" not in done.stderr + done.stdout


def _run_on_a_taken_port(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The launcher given a port the test holds (bound, not listening): had it gone as far as binding,
    it would fail there and say so, so a run that says nothing of the port never bound nor listened."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        done = subprocess.run(
            [sys.executable, "-m", "app", "--port", str(held.getsockname()[1])],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    output = done.stdout + done.stderr
    for bound in ("address already in use", "Uvicorn running", "Application startup complete"):
        assert bound not in output, output
    assert "Traceback" not in output, output
    return done


def test_a_model_litellm_cannot_route_stops_the_launcher_before_anything_listens(
    database_url: str, tmp_path: Path
) -> None:
    """It used to be found beside the start, after "Application startup complete": the server accepted
    connections for a moment, then exited."""
    models = _models(tmp_path, {"local": {"api_base": "http://127.0.0.1:9/v1", "models": ["fake-model"]}})
    done = _run_on_a_taken_port(_env(database_url, PARLEY_MODELS_FILE=str(models)))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("parley: models file: model 'fake-model'"), line


def test_a_setting_that_cannot_be_used_is_one_line_naming_it_before_anything_listens(
    database_url: str,
) -> None:
    secret = "not-a-number-but-maybe-a-secret"
    done = _run_on_a_taken_port(_env(database_url, PARLEY_MIGRATE="maybe", PARLEY_SSE_PING_INTERVAL=secret))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["PARLEY_MIGRATE", "PARLEY_SSE_PING_INTERVAL"]
    assert all(line.startswith("parley: ") for line in lines)
    assert secret not in done.stderr


def test_an_object_store_without_its_aws_keys_is_one_line_before_anything_listens(database_url: str) -> None:
    env = {
        k: v
        for k, v in _env(database_url, PARLEY_FILES_URL="s3://bucket/x").items()
        if not k.startswith("AWS_")
    }
    done = _run_on_a_taken_port(env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "parley: PARLEY_FILES_URL names an S3 bucket: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    ]


def test_an_unset_key_variable_is_a_warning_or_by_setting_an_error(database_url: str, tmp_path: Path) -> None:
    provider = {
        "api_base": "http://127.0.0.1:9/v1",
        "api_key_env": "PARLEY_TEST_UNSET_KEY",
        "models": ["openai/m"],
    }
    models = _models(tmp_path, {"house": provider})
    env = _env(database_url, PARLEY_MODELS_FILE=str(models))
    log = tmp_path / "server.log"
    with serving(env, log):
        pass
    warnings = [line for line in log.read_text().splitlines() if "PARLEY_TEST_UNSET_KEY" in line]
    assert len(warnings) == 1 and warnings[0].startswith("parley: warning:"), log.read_text()

    done = _run({**env, "PARLEY_MISSING_KEY": "error"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        line.replace("warning:", "error:").replace("=warn)", "=error)") for line in warnings
    ]
    os.environ.pop("PARLEY_TEST_UNSET_KEY", None)
    assert [p.model for p in missing_keys(ModelCatalog.load(models))] == ["openai/m"]


def test_json_logs_carry_the_request_and_session_ids_and_4xx_lines_are_printed(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    with serving(_env(database_url, PARLEY_LOG_FORMAT="json"), log) as url:
        missing = httpx.get(f"{url}/v1/sessions/s_0123456789abcdef0123")
        assert missing.status_code == 404
    request_id = missing.json()["error"]["request_id"]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    ours = [line for line in lines if line["request_id"] == request_id]
    assert {line["logger"] for line in ours} == {"app.errors", "uvicorn.access"}, ours
    assert all(line["session_id"] == "s_0123456789abcdef0123" for line in ours)
    [access] = [line for line in ours if line["logger"] == "uvicorn.access"]
    assert (access["method"], access["status"]) == ("GET", 404)
    [startup] = [line for line in lines if line["message"].startswith("Parley ")]
    assert "auth open (no API keys)" in startup["message"]


def test_the_human_format_prints_the_services_own_lines(database_url: str, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with serving(_env(database_url), log) as url:
        request_id = httpx.get(f"{url}/v1/sessions/nope").json()["error"]["request_id"]
    text = log.read_text()
    assert f"-> 404 not_found, request {request_id}" in text
    assert "metrics off; tracing off" in text


def test_a_dot_env_file_is_read_and_the_environment_wins(database_url: str, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PARLEY_METRICS=1\nPARLEY_CORS_ORIGINS=https://from-dotenv.example\n")
    env = _env(database_url, PYTHONPATH=str(ROOT), PARLEY_CORS_ORIGINS="https://from-env.example")
    log = tmp_path / "server.log"
    with serving(env, log, cwd=tmp_path) as url:
        assert httpx.get(f"{url}/metrics").status_code == 200
    text = log.read_text()
    assert "metrics on" in text and "CORS origins https://from-env.example" in text


def test_inside_a_container_the_refusal_advises_keys_or_allow_open(database_url: str) -> None:
    done = _run(_env(database_url, container="podman"), "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "Inside a container" in done.stderr and "PARLEY_ALLOW_OPEN=1" in done.stderr
    assert "PARLEY_API_KEYS=" in done.stderr and "bind to 127.0.0.1" not in done.stderr


def test_outside_a_container_the_refusal_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.startup.in_container", lambda: False)
    assert container_advice("as it was", "0.0.0.0") == "as it was"


def test_the_startup_line_shows_no_credentials() -> None:
    settings = Settings(
        database_url="postgresql+psycopg://parley:s3cret-pw@db.internal:5432/parley",
        api_keys="alice:alice-key-0123456789abcdef",
        cors_origins=["https://app.example.com"],
    )
    line = describe(settings, ModelCatalog({}), "0.0.0.0", 8000)
    assert "s3cret-pw" not in line and "alice-key" not in line
    assert "postgresql+psycopg://parley:***@db.internal:5432/parley" in line
    assert "auth API keys" in line and "CORS origins https://app.example.com" in line
