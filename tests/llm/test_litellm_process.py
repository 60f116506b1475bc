"""LiteLLM's streams run in a child process: started with the first of them, never before; the upstream's
connection belongs to that child, not to the service; a stream closed by its consumer returns at once and
the child closes the upstream connection; a child that dies fails its streams retryably and the next
stream starts another; children get the service's environment and CPU affinity; `stop()` ends the child;
a killed service leaves no process behind.

Where work happens is read from the kernel (/proc: which process holds a socket, whose child a process
is), never inferred from timings. Models with `"adapter": "litellm"` against a `FakeUpstream`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from app.llm.gateway import ModelGateway
from app.llm.litellm_adapter import LiteLLMAdapter
from app.llm.litellm_child import NICENESS_ABOVE_SERVICE
from app.llm.types import ModelAdapter, ModelRequest, ProviderError, StreamPart, TextPart
from app.settings import DEMO_MODEL, Settings
from tests.fakes.upstream import FakeUpstream, Script
from tests.llm.procfs import children, command_line, connection_owners, needs_proc, running
from tests.support.process import server_process

pytestmark = pytest.mark.anyio

MODEL = "openai/in-child"  # read by LiteLLM's stream ("adapter": "litellm")
LEAN = "openai/lean"  # the same upstream, read by the lean reader in the service's process
FROM_ENV = "openai/from-env"  # no base URL or key in the file: LiteLLM finds both in the environment
SLOW = Script.text(" ".join(f"w{n}" for n in range(200)), chunks=200, delay=0.05)  # ~10 s if read to the end


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as running_upstream:
        yield running_upstream


@pytest.fixture
async def gateway(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[ModelGateway]:
    path = tmp_path / "models.json"
    providers = {
        "child": {"adapter": "litellm", "api_base": upstream.base_url, "models": [MODEL]},
        "lean": {"api_base": upstream.base_url, "models": [LEAN]},
        "env": {"adapter": "litellm", "models": [FROM_ENV]},
    }
    path.write_text(json.dumps({"providers": providers}), encoding="utf-8")
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}", models_file=path, demo_token_delay=0.0
    )
    model_layer = ModelGateway(settings)
    model_layer.start()
    await model_layer.ready()
    yield model_layer
    await model_layer.stop()


async def _adapter(gateway: ModelGateway, model: str) -> tuple[ModelAdapter, ModelRequest]:
    resolved = await gateway.resolve(model)
    request = ModelRequest(resolved, [{"role": "user", "content": "hi"}], [], 10.0)
    return await gateway.adapter(resolved), request


def _text(parts: list[StreamPart]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart))


def _child_pid(gateway: ModelGateway) -> int:
    pid = gateway.litellm_process.pid
    assert pid is not None
    return pid


# --- where streams run ------------------------------------------------------------------------------------


@needs_proc
async def test_no_child_until_the_first_litellm_stream(gateway: ModelGateway, upstream: FakeUpstream) -> None:
    assert gateway.litellm_process.pid is None
    upstream.enqueue(Script.text("lean"))
    for model in (DEMO_MODEL, LEAN):  # in-process adapters start nothing
        adapter, request = await _adapter(gateway, model)
        assert not isinstance(adapter, LiteLLMAdapter)
        assert _text([part async for part in adapter.stream(request)])
    assert gateway.litellm_process.pid is None

    adapter, request = await _adapter(gateway, MODEL)
    upstream.enqueue(Script.text("from the child"))
    assert _text([part async for part in adapter.stream(request)]) == "from the child"
    pid = _child_pid(gateway)
    assert pid != os.getpid() and running(pid)
    # A plain process of this one: `python -m app.llm.litellm_child`.
    assert pid in children(os.getpid())
    assert "app.llm.litellm_child" in command_line(pid)


@needs_proc
async def test_the_upstream_connection_belongs_to_the_child(
    gateway: ModelGateway, upstream: FakeUpstream
) -> None:
    """LiteLLM's request and iteration happen in the child; the lean reader's in this process (the check
    sees this process's sockets too)."""
    for model, in_child in ((MODEL, True), (LEAN, False)):
        adapter, request = await _adapter(gateway, model)
        upstream.enqueue(SLOW)
        stream = adapter.stream(request)
        try:
            await anext(stream)
            owners = connection_owners(upstream.port)
        finally:
            await stream.aclose()
        if in_child:
            assert owners == {_child_pid(gateway)}
        else:
            assert os.getpid() in owners


@needs_proc
async def test_concurrent_first_streams_share_one_child(
    gateway: ModelGateway, upstream: FakeUpstream
) -> None:
    adapter, request = await _adapter(gateway, MODEL)
    upstream.enqueue(*[SLOW] * 5)
    streams = [adapter.stream(request) for _ in range(5)]
    try:
        await asyncio.gather(*(anext(stream) for stream in streams))
        assert len(upstream.requests) == 5
        # Five connections, one process: one start, shared.
        assert connection_owners(upstream.port) == {_child_pid(gateway)}
    finally:
        for stream in streams:
            await stream.aclose()


# --- stop, death, restart ---------------------------------------------------------------------------------


async def test_a_closed_stream_returns_at_once_and_the_child_closes_the_upstream(
    gateway: ModelGateway, upstream: FakeUpstream
) -> None:
    adapter, request = await _adapter(gateway, MODEL)
    upstream.enqueue(SLOW)
    stream = adapter.stream(request)
    await anext(stream)
    [recorded] = upstream.requests
    pid = _child_pid(gateway)
    os.kill(pid, signal.SIGSTOP)  # the child can answer nothing now
    try:
        # Returns although the child cannot act: closing sends the cancel and waits for nothing.
        await asyncio.wait_for(stream.aclose(), 10)
        assert not recorded.disconnected  # only the child can close that connection...
    finally:
        os.kill(pid, signal.SIGCONT)
    await upstream.await_disconnect(within=10)  # ...and it does, once it runs again
    assert recorded.disconnected and recorded.chunks_sent < 200
    # The child lives on and serves the next stream.
    upstream.enqueue(Script.text("still here"))
    assert _text([part async for part in adapter.stream(request)]) == "still here"
    assert gateway.litellm_process.pid == pid


async def test_a_child_that_dies_fails_its_streams_retryably_and_the_next_stream_starts_another(
    gateway: ModelGateway, upstream: FakeUpstream
) -> None:
    adapter, request = await _adapter(gateway, MODEL)
    upstream.enqueue(SLOW)
    stream = adapter.stream(request)
    await anext(stream)
    dead = _child_pid(gateway)
    os.kill(dead, signal.SIGKILL)
    with pytest.raises(ProviderError) as failed:
        async for _ in stream:
            pass
    assert (failed.value.code, failed.value.retryable) == ("provider_stream_interrupted", True)
    assert failed.value.message == "The model provider's stream broke off before the response was complete."
    assert gateway.litellm_process.pid is None

    upstream.enqueue(Script.text("a new child"))
    assert _text([part async for part in adapter.stream(request)]) == "a new child"
    assert _child_pid(gateway) != dead
    assert not running(dead)


async def test_stop_ends_the_child_its_streams_and_any_later_start(
    gateway: ModelGateway, upstream: FakeUpstream
) -> None:
    adapter, request = await _adapter(gateway, MODEL)
    upstream.enqueue(SLOW)
    stream = adapter.stream(request)
    await anext(stream)
    pid = _child_pid(gateway)
    await gateway.stop()
    assert not running(pid)
    await upstream.await_disconnect(within=10)  # the child closed it before it exited
    with pytest.raises(ProviderError) as ended:
        async for _ in stream:
            pass
    assert ended.value.code == "provider_stream_interrupted"
    with pytest.raises(ProviderError) as refused:
        await anext(adapter.stream(request))
    assert refused.value.code == "provider_unavailable"
    assert gateway.litellm_process.pid is None


# --- what the child inherits, what it reports ---------------------------------------------------------


async def test_children_get_the_services_environment_and_affinity_and_a_lower_priority(
    gateway: ModelGateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set after the model layer started: the child takes the service's environment (API keys) and CPU
    affinity as they are when it starts, with the first tail stream."""
    monkeypatch.setenv("OPENAI_API_BASE", upstream.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-only-in-the-environment")
    pinned = None
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        saved = os.sched_getaffinity(0)
        pinned = {min(saved)}
        os.sched_setaffinity(0, pinned)
    try:
        adapter, request = await _adapter(gateway, FROM_ENV)
        upstream.enqueue(Script.text("keyed"))
        assert _text([part async for part in adapter.stream(request)]) == "keyed"
        if pinned is not None:
            assert os.sched_getaffinity(_child_pid(gateway)) == pinned
        # Below the service's priority: when both want the core, the service's loop goes first.
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, _child_pid(gateway)) == min(19, ours + NICENESS_ABOVE_SERVICE)
    finally:
        if pinned is not None:
            os.sched_setaffinity(0, saved)
    [recorded] = upstream.requests
    assert recorded.headers["authorization"] == "Bearer sk-only-in-the-environment"


async def test_errors_are_mapped_in_the_child_and_the_upstreams_words_reach_only_the_log(
    gateway: ModelGateway, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    adapter, request = await _adapter(gateway, MODEL)
    upstream.enqueue(Script.error(429, "the upstream's secret words"))
    with pytest.raises(ProviderError) as failed:
        await anext(adapter.stream(request))
    assert (failed.value.code, failed.value.status, failed.value.retryable) == (
        "provider_rate_limited",
        429,
        True,
    )
    assert "secret" not in failed.value.message
    # The child's log record, logged here through this process's logging.
    [record] = [r for r in caplog.records if "secret words" in r.getMessage()]
    assert record.name == "app.llm.provider_errors"
    assert record.levelno == logging.WARNING


# --- a real server process ----------------------------------------------------------------------------


@needs_proc
@pytest.mark.slow
@pytest.mark.processes
def test_a_killed_service_leaves_no_process_behind(
    database_url: str, tmp_path: Path, upstream: FakeUpstream
) -> None:
    """`python -m uvicorn app.main:app`: no child once ready; a tail model's turn starts one child; after
    kill -9 of the server it exits (its connection to the server closed)."""
    models = tmp_path / "models.json"
    tail = {"adapter": "litellm", "api_base": upstream.base_url, "models": [MODEL]}
    models.write_text(json.dumps({"providers": {"tail": tail}}), encoding="utf-8")
    env = {"PARLEY_DATABASE_URL": database_url, "PARLEY_MODELS_FILE": str(models)}
    upstream.enqueue(Script.text("from the tail"))
    with server_process(env, tmp_path / "server.log") as server:
        assert server.process is not None
        service = server.process.pid
        assert children(service) == []
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            sid = client.post("/v1/sessions", json={"model": MODEL}).json()["id"]
            turn = client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "hello"}).json()
        assert turn["status"] == "completed", server.log()
        [child] = children(service)
        assert "app.llm.litellm_child" in command_line(child)
        server.kill()
    deadline = time.monotonic() + 30  # a bound against hanging, not a measurement
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)
