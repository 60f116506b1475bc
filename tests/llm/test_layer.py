"""The model layer: which stream adapter each model gets, LiteLLM's streams on their own thread and loop,
the worker's shutdown, and litellm imported without building its default tiktoken encoding.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from app.llm.demo import DemoAdapter
from app.llm.layer import ModelLayer
from app.llm.litellm_adapter import LiteLLMAdapter
from app.llm.litellm_worker import PartChannel
from app.llm.openai_compat import OpenAICompatAdapter
from app.llm.types import ModelRequest, ProviderError, ResolvedModel, StreamPart, TextPart
from app.settings import DEMO_MODEL, Settings

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:9/v1"

MODELS: dict[str, Any] = {
    "providers": {
        "vllm": {"api_base": BASE, "models": ["hosted_vllm/qwen", "openai/local"]},
        "pinned": {"adapter": "litellm", "api_base": BASE, "models": ["openai/pinned"]},
        "forced": {"adapter": "openai", "api_base": BASE, "models": ["ollama_chat/llama3.1", "house-model"]},
        "no-base": {"models": ["hosted_vllm/nobase"]},
        "forced-no-base": {"adapter": "openai", "models": ["ollama_chat/nobase"]},
    }
}


def _settings(tmp_path: Path, stream_adapter: Literal["auto", "litellm"] = "auto") -> Settings:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(MODELS), encoding="utf-8")
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}",
        models_file=path,
        demo_token_delay=0.0,
        stream_adapter=stream_adapter,
    )


@pytest.fixture
async def layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ModelLayer]:
    for variable in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    model_layer = ModelLayer(_settings(tmp_path))
    model_layer.start()
    await model_layer.ready()
    yield model_layer
    await model_layer.stop()


# --- which adapter ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "url", "sent_as"),
    [
        ("hosted_vllm/qwen", f"{BASE}/chat/completions", "qwen"),
        ("openai/local", f"{BASE}/chat/completions", "local"),
        (
            "gpt-4o-mini",
            "https://api.openai.com/v1/chat/completions",
            "gpt-4o-mini",
        ),  # LiteLLM's default base
        # "adapter": "openai" takes providers LiteLLM does not call OpenAI-compatible, and unknown names.
        ("ollama_chat/llama3.1", f"{BASE}/chat/completions", "llama3.1"),
        ("house-model", f"{BASE}/chat/completions", "house-model"),
    ],
)
async def test_openai_compatible_models_take_the_lean_reader(
    layer: ModelLayer, model: str, url: str, sent_as: str
) -> None:
    adapter = await layer.adapter(await layer.resolve(model))
    assert isinstance(adapter, OpenAICompatAdapter)
    assert (adapter.endpoint.url, adapter.endpoint.model) == (url, sent_as)


@pytest.mark.parametrize(
    "model",
    [
        "openai/pinned",  # "adapter": "litellm" in the models file
        "hosted_vllm/nobase",  # no base URL to call
        "ollama_chat/nobase",  # "adapter": "openai", but no base URL for a provider LiteLLM maps itself
        "o1-pro",  # LiteLLM bridges it to the Responses API
        "anthropic/claude-sonnet-4-5",  # not OpenAI-compatible
        "threadprobe/anything",  # a custom provider
    ],
)
async def test_other_models_keep_litellms_stream(layer: ModelLayer, model: str) -> None:
    assert isinstance(await layer.adapter(await layer.resolve(model)), LiteLLMAdapter)


async def test_the_demo_streams_in_process(layer: ModelLayer) -> None:
    assert isinstance(await layer.adapter(await layer.resolve(DEMO_MODEL)), DemoAdapter)


async def test_stream_adapter_litellm_forces_litellm_everywhere(tmp_path: Path) -> None:
    forced = ModelLayer(_settings(tmp_path, stream_adapter="litellm"))
    forced.start()
    await forced.ready()
    try:
        for model in (DEMO_MODEL, "hosted_vllm/qwen", "gpt-4o-mini", "house-model"):
            assert isinstance(await forced.adapter(await forced.resolve(model)), LiteLLMAdapter), model
    finally:
        await forced.stop()


async def test_keys_as_litellm_finds_them(layer: ModelLayer, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = await layer.adapter(await layer.resolve("gpt-4o-mini"))
    assert isinstance(adapter, OpenAICompatAdapter)
    request = ModelRequest(ResolvedModel("gpt-4o-mini", None), [{"role": "user", "content": "hi"}], [], 5.0)
    # No key anywhere: refused before any connection is tried (the default base is not reachable here).
    with pytest.raises(ProviderError) as caught:
        await anext(adapter.stream(request))
    assert (caught.value.code, caught.value.retryable) == ("provider_auth_missing", False)

    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    adapter = await layer.adapter(await layer.resolve("gpt-4o-mini"))
    assert isinstance(adapter, OpenAICompatAdapter)
    assert adapter.endpoint.headers["authorization"] == "Bearer sk-from-env"
    # A configured base URL without a key sends a placeholder, as LiteLLMAdapter does.
    local = await layer.adapter(await layer.resolve("openai/local"))
    assert isinstance(local, OpenAICompatAdapter)
    assert local.endpoint.headers["authorization"] == "Bearer no-key"


# --- LiteLLM's streams run on the worker's thread and loop -------------------------------------------------


@dataclass
class Probe:
    """Where a custom LiteLLM provider's stream ran: thread and loop of each step."""

    chunks: int = 3
    delay: float = 0.0
    seen: list[tuple[str, threading.Thread, asyncio.AbstractEventLoop]] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)

    def note(self, step: str) -> None:
        self.seen.append((step, threading.current_thread(), asyncio.get_running_loop()))


USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


def _chunk(text: str) -> dict[str, Any]:
    """A litellm GenericStreamingChunk."""
    return {
        "text": text,
        "tool_use": None,
        "is_finished": False,
        "finish_reason": "",
        "usage": None,
        "index": 0,
    }


@pytest.fixture
def probe() -> Iterator[Probe]:
    import litellm

    state = Probe()

    class ThreadProbe(litellm.CustomLLM):  # type: ignore[misc]
        async def astreaming(self, **_: object) -> AsyncIterator[dict[str, Any]]:
            state.note("stream")
            try:
                for n in range(state.chunks):
                    if state.delay:
                        await asyncio.sleep(state.delay)
                    yield _chunk(f"t{n} ")
                yield {**_chunk(""), "is_finished": True, "finish_reason": "stop", "usage": USAGE}
            finally:
                state.note("close")
                state.closed.set()

    saved = list(litellm.custom_provider_map)
    litellm.custom_provider_map = [*saved, {"provider": "threadprobe", "custom_handler": ThreadProbe()}]
    litellm.utils.custom_llm_setup()
    yield state
    litellm.custom_provider_map = saved


def _probe_request() -> ModelRequest:
    return ModelRequest(ResolvedModel("threadprobe/x", None), [{"role": "user", "content": "hi"}], [], 5.0)


async def test_litellm_streams_run_on_the_worker_thread_and_loop(layer: ModelLayer, probe: Probe) -> None:
    adapter = await layer.adapter(await layer.resolve("threadprobe/x"))
    first = [part async for part in adapter.stream(_probe_request())]
    second = [part async for part in adapter.stream(_probe_request())]
    assert [p.text for p in first if isinstance(p, TextPart)] == ["t0 ", "t1 ", "t2 "]
    assert first == second
    threads = {thread for _, thread, _ in probe.seen}
    loops = {loop for _, _, loop in probe.seen}
    assert [step for step, _, _ in probe.seen] == ["stream", "close", "stream", "close"]
    # Off the caller's thread and loop, always on the same ones (LiteLLM caches clients per loop).
    assert threads == {layer.stream_thread}
    assert threading.current_thread() not in threads
    assert len(loops) == 1
    assert asyncio.get_running_loop() not in loops


async def test_closing_the_stream_closes_it_on_the_worker(layer: ModelLayer, probe: Probe) -> None:
    probe.chunks, probe.delay = 1000, 0.01
    adapter = await layer.adapter(await layer.resolve("threadprobe/x"))
    stream = adapter.stream(_probe_request())
    received: list[StreamPart] = [await anext(stream), await anext(stream)]
    await stream.aclose()
    # Generous bound: this checks that the close reaches the worker, not how fast.
    assert await asyncio.to_thread(probe.closed.wait, 5.0)
    assert len(received) == 2
    assert probe.seen[-1][0] == "close"
    assert probe.seen[-1][1] is layer.stream_thread


async def test_stop_ends_the_worker_thread(tmp_path: Path) -> None:
    model_layer = ModelLayer(_settings(tmp_path))
    model_layer.start()
    await model_layer.ready()
    thread = model_layer.stream_thread
    assert thread is not None and thread.is_alive()
    await model_layer.stop()
    assert not thread.is_alive()


async def test_parts_cross_threads_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    wakeups: list[object] = []
    schedule = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any) -> asyncio.Handle:
        wakeups.append(callback)
        return schedule(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    channel = PartChannel(loop)

    def produce() -> None:
        for n in range(100):
            channel.put([TextPart(str(n))])
        channel.end()

    worker = threading.Thread(target=produce)
    worker.start()
    worker.join()  # this loop is blocked meanwhile: everything lands in one batch
    parts, ended, error = await channel.take()
    assert [p.text for p in parts if isinstance(p, TextPart)] == [str(n) for n in range(100)]
    assert (ended, error) == (True, None)
    assert len(wakeups) == 1


# --- litellm without its default encoding ------------------------------------------------------------------

_LAZY_SCRIPT = """
import asyncio, gc, json, sys
from app.llm.layer import ModelLayer
from app.llm.lazy_encoding import REAL_MODULE, default_encoding_loaded
from app.settings import Settings

async def main() -> None:
    layer = ModelLayer(Settings(database_url=sys.argv[1]))
    layer.start()
    litellm = await layer.ready()
    import tiktoken.registry
    report = {"after_load": default_encoding_loaded(), "encodings": sorted(tiktoken.registry.ENCODINGS)}
    report["frozen"] = gc.get_freeze_count()
    report["gpt_4o"] = litellm.token_counter(model="gpt-4o", text="Hello there, how are you today?")
    report["before_default_use"] = default_encoding_loaded()
    # What litellm bound at import, used: the proxy builds the real encoding and delegates to it.
    bound = litellm.litellm_core_utils.token_counter.default_encoding
    report["default_tokens"] = len(bound.encode("Hello there, how are you today?"))
    report["after_default_use"] = default_encoding_loaded()
    report["real_module"] = type(sys.modules[REAL_MODULE].encoding).__name__
    await layer.stop()
    print(json.dumps(report))

asyncio.run(main())
"""


@pytest.mark.slow
def test_litellm_loads_lean(tmp_path: Path) -> None:
    """Without building tiktoken's default encoding (until it is used), with its objects frozen."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _LAZY_SCRIPT, url], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["after_load"] is False
    # What the import left behind is out of the cyclic collector's way (no 100 ms full collections).
    assert report["frozen"] > 100_000
    assert "cl100k_base" not in report["encodings"]
    assert report["gpt_4o"] == 8
    assert report["before_default_use"] is False  # gpt-4o counts with o200k_base
    assert report["default_tokens"] == 8
    assert report["after_default_use"] is True
    assert report["real_module"] == "Encoding"
