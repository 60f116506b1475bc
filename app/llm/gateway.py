"""The model layer: the only owner of the litellm module, loaded off the event loop at startup.

`import litellm` costs seconds and ~170 MB; health, history and streams must not wait for it, so it is
imported (litellm_import.py) in a worker thread and everything that needs a model awaits `ready()`. Here
litellm resolves models (routing, context windows, `is_known`); it streams nothing. The gateway also picks
the stream adapter of each model: the in-process demo, the lean OpenAI-compatible reader (one pooled
aiohttp session), or LiteLLM's own stream, which runs in a child process started with the first such
stream (`adapter()`, litellm_process.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from types import ModuleType
from typing import TYPE_CHECKING

from app.llm.demo import DEMO_MODEL, DemoAdapter
from app.llm.litellm_adapter import LiteLLMAdapter
from app.llm.litellm_import import frozen_afterwards, import_litellm
from app.llm.litellm_process import LiteLLMProcess
from app.llm.models_file import ModelCatalog
from app.llm.observed import ObservedAdapter
from app.llm.routing import resolve_endpoint
from app.llm.types import ModelAdapter, ModelRequest, ResolvedModel
from app.settings import Settings

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)


def _import_model_modules() -> ModuleType:
    """litellm, then the lean readers' modules, all in the loading thread.

    The lean reader is imported here rather than with this module: its aiohttp costs ~0.1 s of imports
    that a cold start would otherwise spend before /healthz answers, and no model stream is read before
    the layer has loaded. `_load` and `adapter` import from it once this has run.
    """
    module = import_litellm()
    importlib.import_module("app.llm.openai_compat")
    importlib.import_module("app.llm.anthropic")
    return module


def _settle(litellm: ModuleType) -> None:
    """What LiteLLM builds lazily on first use here (its model-name index) is built now, and frozen with the
    import, out of every later full collection. LiteLLM's call path is warmed up in its child process
    (litellm_child.py), the only place it runs; the lean reader's first request mapping costs ~2 ms and
    ~100 lasting objects (measured), left to the first request. Runs in the loading thread."""
    with frozen_afterwards(), contextlib.suppress(Exception):
        litellm.get_model_info(DEMO_MODEL)


class UnknownModelError(LookupError):
    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class ModelGateway:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.catalog = ModelCatalog.load(settings.models_file)
        self._litellm: ModuleType | None = None
        self._demo = DemoAdapter(settings.demo_token_delay)
        # No process yet: the child starts with the first LiteLLM stream.
        self._process = LiteLLMProcess(settings.demo_token_delay)
        self._litellm_adapter = LiteLLMAdapter(self._process)
        self._http: aiohttp.ClientSession | None = None
        self._loaded = asyncio.Event()
        self._load_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._load(), name="model-gateway-load")

    async def _load(self) -> None:
        try:
            module = await asyncio.to_thread(_import_model_modules)
            from app.llm.demo_litellm import register_demo
            from app.llm.openai_compat import new_http_client

            register_demo(self._settings.demo_token_delay)
            self._http = new_http_client()
            await asyncio.to_thread(_settle, module)
            self._litellm = module
        except asyncio.CancelledError as exc:  # stopped while loading (a shutdown): nothing failed
            self._load_error = exc
            raise
        except BaseException as exc:
            log.exception("loading the model layer failed")
            self._load_error = exc
            raise
        finally:
            self._loaded.set()

    @property
    def is_ready(self) -> bool:
        return self._litellm is not None

    @property
    def litellm_process(self) -> LiteLLMProcess:
        """Where LiteLLM's streams run: its `pid` is None until the first of them."""
        return self._process

    async def ready(self) -> ModuleType:
        await self._loaded.wait()
        if self._litellm is None:
            raise RuntimeError("the model layer failed to load") from self._load_error
        return self._litellm

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])
        await self._process.stop()
        if self._http is not None:
            await self._http.close()

    async def observed_adapter(self, model: ResolvedModel) -> ModelAdapter:
        """What a turn calls the model through: `adapter(model)`, observed (spans, metrics) and completed
        with estimated usage when the provider sends none (observed.py)."""
        litellm = await self.ready()
        inner = await self.adapter(model)
        return ObservedAdapter(
            inner, self._label(litellm, model.name), _provider(litellm, model), self._estimate
        )

    def _label(self, litellm: ModuleType, name: str) -> str:
        """The model as a metric label: names the server knows, else "other" (a label set stays bounded
        even when clients name any model behind a provider prefix)."""
        known = name == DEMO_MODEL or self.catalog.get(name) is not None or name in litellm.model_cost
        return name if known else "other"

    def _estimate(self, model: str, request: ModelRequest, completion: str) -> tuple[int, int]:
        """LiteLLM's token counter (tiktoken for models it has no tokenizer of); a rough count if it fails."""
        litellm = self._litellm
        try:
            assert litellm is not None
            prompt = int(litellm.token_counter(model=model, messages=list(request.messages)))
            output = int(litellm.token_counter(model=model, text=completion)) if completion else 0
        except Exception:
            log.debug("token_counter failed for %s; counting characters", model, exc_info=True)
            chars = sum(len(str(m.get("content") or "")) for m in request.messages)
            return max(1, chars // 4), len(completion) // 4
        return prompt, output

    async def adapter(self, model: ResolvedModel) -> ModelAdapter:
        """Demo in-process; otherwise the models file's `adapter` choice, unless PARLEY_STREAM_ADAPTER
        forces LiteLLM everywhere; "auto" takes the Anthropic reader (anthropic.py) for models LiteLLM
        routes to Anthropic, the lean reader where routing.py finds the model OpenAI-compatible."""
        litellm = await self.ready()
        assert self._http is not None
        forced_litellm = self._settings.stream_adapter == "litellm"
        if model.name == DEMO_MODEL:
            return self._litellm_adapter if forced_litellm else self._demo
        choice = self.catalog.adapter(model.name)
        if forced_litellm or choice == "litellm":
            return self._litellm_adapter
        if choice == "auto":
            from app.llm import anthropic  # loaded by _import_model_modules

            configured = self.catalog.get(model.name)
            native = anthropic.resolve(
                litellm,
                model,
                max_output_tokens=configured.max_output_tokens if configured is not None else None,
                prompt_cache=configured.prompt_cache if configured is not None else None,
                reasoning_budget=configured.reasoning_budget if configured is not None else None,
            )
            if native is not None:
                return anthropic.AnthropicAdapter(self._http, native)
        endpoint = resolve_endpoint(litellm, model, forced=choice == "openai")
        if endpoint is None:
            return self._litellm_adapter
        from app.llm.openai_compat import OpenAICompatAdapter  # loaded by _import_model_modules

        return OpenAICompatAdapter(self._http, endpoint)

    async def is_known(self, model: str) -> bool:
        """Demo, models file, or a model LiteLLM can route (its cost table or a known provider prefix)."""
        if model == DEMO_MODEL or self.catalog.get(model) is not None:
            return True
        litellm = await self.ready()
        if model in litellm.model_cost:
            return True
        provider = model.split("/", 1)[0] if "/" in model else None
        return provider is not None and provider in litellm.provider_list

    async def context_window(self, model: str) -> int | None:
        configured = self.catalog.get(model)
        if configured is not None and configured.context_window is not None:
            return configured.context_window
        litellm = await self.ready()
        try:
            value = litellm.get_model_info(model).get("max_input_tokens")
        except Exception:
            return None
        return int(value) if isinstance(value, int) and value > 0 else None

    async def resolve(self, model: str) -> ResolvedModel:
        return self.catalog.resolve(model, await self.context_window(model))

    def model_names(self) -> list[str]:
        names = [DEMO_MODEL, *self.catalog.names()]
        return list(dict.fromkeys(names))


def _provider(litellm: ModuleType, model: ResolvedModel) -> str | None:
    """The provider LiteLLM routes the model to (the spans' gen_ai.provider.name)."""
    if model.name == DEMO_MODEL:
        return "parley"
    try:
        return str(litellm.get_llm_provider(model=model.name, api_base=model.api_base)[1])
    except Exception:
        return model.provider
