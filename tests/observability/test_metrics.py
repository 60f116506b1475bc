"""GET /metrics on a live server: after a scripted turn with a tool and a stopped turn, the scraped values
match what happened. How it proves it: counts are compared exactly (two turns started, one completed, one
cancelled, one current_time call, one stop, three model calls), histograms must hold observations, and no
label value anywhere is a session, turn or message id. The scrape is the Prometheus text format parsed by
prometheus-client's own parser, from a real uvicorn server over a real socket."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.metrics import router
from app.main import create_app
from app.observability.metrics import Metrics
from app.settings import Settings
from tests.support.server import LiveServer, live_server

TOKEN = "scrape-token-0123456789"


@pytest.fixture
def metrics_server(database_url: str) -> Iterator[LiveServer]:
    settings = Settings(database_url=database_url, demo_token_delay=0.005, metrics=True, metrics_token=TOKEN)
    with live_server(settings) as running:
        yield running


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def stop_once_text_streams(client: httpx.Client, session_id: str) -> None:
    """Posts a long answer and stops it once its text streams: there is something to interrupt."""
    with client.stream("GET", f"/v1/sessions/{session_id}/events?format=ndjson") as stream:
        posted = client.post(f"/v1/sessions/{session_id}/messages", json={"content": "[long] a story"})
        assert posted.status_code == 202
        for line in stream.iter_lines():
            if line and json.loads(line)["type"] == "text_delta":
                break
        cancelled = client.post(f"/v1/sessions/{session_id}/cancel")
        assert cancelled.status_code == 202, cancelled.text


def test_a_scrape_after_a_tool_turn_and_a_stop_counts_what_happened(metrics_server: LiveServer) -> None:
    with httpx.Client(base_url=metrics_server.base_url, timeout=30) as client:
        assert client.get("/metrics").status_code == 401  # its own token, not an API key
        session_id = client.post("/v1/sessions", json={}).json()["id"]
        done = client.post(
            f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "what time is it?"}
        )
        assert done.status_code == 200 and done.json()["status"] == "completed"
        stop_once_text_streams(client, session_id)
        turns = client.get(f"/v1/sessions/{session_id}/turns").json()
        samples = scrape(client)

    assert value(samples, "parley_turns_started_total") == 2
    assert value(samples, "parley_turns_ended_total", status="completed") == 1
    assert value(samples, "parley_turns_ended_total", status="cancelled") == 1
    assert value(samples, "parley_turn_duration_seconds_count", status="completed") == 1
    assert value(samples, "parley_cancels_total") == 1
    assert value(samples, "parley_tool_calls_total", tool="current_time", source="builtin", outcome="ok") == 1
    assert value(samples, "parley_tool_duration_seconds_count", tool="current_time", source="builtin") == 1
    # The tool turn calls the model twice (the call, then the answer); the stopped turn once.
    assert value(samples, "parley_model_first_token_seconds_count", model="parley/demo") == 3
    assert value(samples, "parley_model_response_seconds_count", model="parley/demo") == 3
    assert value(samples, "parley_cancel_disconnect_seconds_count") == 1
    # The demo model reports usage for the two finished responses: nothing was estimated.
    assert value(samples, "parley_model_tokens_total", model="parley/demo", direction="input") > 0
    assert value(samples, "parley_model_tokens_estimated_total", model="parley/demo", direction="input") == 0
    assert value(samples, "parley_events_sent_total") > 0
    assert value(samples, "parley_open_streams") == 0
    assert value(samples, "parley_db_commit_seconds_count", kind="turn") > 0

    ids = {session_id, *(t["turn_id"] for t in turns["turns"])}
    label_values = {v for (_, labels) in samples for _, v in labels}
    assert not ids & label_values
    assert not any(v.startswith(("s_", "t_", "m_")) for v in label_values), sorted(label_values)


def test_open_streams_and_resumes_are_counted(metrics_server: LiveServer) -> None:
    with httpx.Client(base_url=metrics_server.base_url, timeout=30) as client:
        session_id = client.post("/v1/sessions", json={}).json()["id"]
        with client.stream("GET", f"/v1/sessions/{session_id}/events?after=0&format=ndjson") as stream:
            client.post(f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "hi"})
            # Held, not left by a `for ... break`: a dropped line iterator closes the connection.
            lines = stream.iter_lines()
            while not (line := next(lines)) or json.loads(line)["type"] != "turn_done":
                pass
            during = scrape(client)
        assert value(during, "parley_open_streams") == 1
        assert value(during, "parley_stream_resumes_total") == 1
        # What the process holds for sessions: the one session's state and its stream channel.
        assert value(during, "parley_session_states") == 1
        assert value(during, "parley_stream_channels") == 1


def test_metrics_are_off_by_default(server: LiveServer) -> None:
    assert httpx.get(f"{server.base_url}/metrics").status_code == 404


def test_a_scrape_without_a_token_setting_is_open(database_url: str, tmp_path: Path) -> None:
    with live_server(Settings(database_url=database_url, metrics=True)) as running:
        response = httpx.get(f"{running.base_url}/metrics")
    assert response.status_code == 200
    assert "parley_turns_started_total 0.0" in response.text


def test_metrics_are_not_part_of_the_published_api(database_url: str) -> None:
    spec = create_app(Settings(database_url=database_url, metrics=True)).openapi()
    assert [getattr(route, "path", None) for route in router.routes] == ["/metrics"]
    assert "/metrics" not in spec["paths"]


def test_every_metric_is_in_the_scrape_before_anything_happened() -> None:
    """Scrapers see every family at once (no gaps in dashboards until the first event of each)."""
    text = Metrics().render()[0].decode()
    for name in ("parley_turns_started", "parley_open_streams", "parley_db_commit_seconds"):
        assert f"# TYPE {name}" in text


def test_what_a_process_holds_for_a_session_goes_once_it_rests(database_url: str) -> None:
    """With both keep times at 0 and a fast heartbeat: the session's state goes as its turn ends, its
    stream channel at the first heartbeat after its stream closed, and the gauges say so. A resume after
    that replays the whole turn from the event log, numbered 1..n."""
    settings = Settings(
        database_url=database_url,
        demo_token_delay=0.001,
        metrics=True,
        metrics_token=TOKEN,
        idle_session_seconds=0,
        stream_channel_seconds=0,
        sse_ping_interval=0.2,
    )
    with live_server(settings) as running, httpx.Client(base_url=running.base_url, timeout=30) as client:
        session_id = client.post("/v1/sessions", json={}).json()["id"]
        with client.stream("GET", f"/v1/sessions/{session_id}/events?format=ndjson") as stream:
            done = client.post(f"/v1/sessions/{session_id}/messages?wait=true", json={"content": "hi"})
            assert done.status_code == 200, done.text
            lines = stream.iter_lines()
            while not (line := next(lines)) or json.loads(line)["type"] != "turn_done":
                pass
            during = scrape(client)
        assert value(during, "parley_session_states") == 0  # idle, and kept 0 s
        assert value(during, "parley_stream_channels") == 1  # watched
        deadline = time.monotonic() + 10
        while value(scrape(client), "parley_stream_channels") != 0:
            assert time.monotonic() < deadline, "the channel was never let go"
            time.sleep(0.1)
        with client.stream("GET", f"/v1/sessions/{session_id}/events?after=0&format=ndjson") as stream:
            seqs = []
            for line in stream.iter_lines():
                if line:
                    event = json.loads(line)
                    seqs.append(event["seq"])
                    if event["type"] == "turn_done":
                        break
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 4
