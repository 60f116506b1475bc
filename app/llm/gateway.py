"""The model layer: which adapter streams each model, and what the service knows of models, without LiteLLM.

What LiteLLM knows of providers and models (routing, context windows, output limits) is read from its
package's files as data (litellm_tables.ModelMap, ~50 ms in a worker thread at startup); the service's
process never imports litellm for it. The gateway picks the stream adapter of each model: the in-process
demo, the lean OpenAI-compatible reader (openai_compat.py) or the Anthropic reader (anthropic.py), both on
one pooled aiohttp session, or, for the long tail of providers, LiteLLM's own stream, which runs in a child
process started with the first such stream (`adapter()`, litellm_process.py): the only place litellm is
imported.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import TYPE_CHECKING

from app.llm import tokens
from app.llm.demo import DEMO_MODELS, DemoAdapter
from app.llm.litellm_adapter import LiteLLMAdapter
from app.llm.litellm_process import LiteLLMProcess
from app.llm.litellm_tables import ModelMap
from app.llm.models_file import ModelCatalog
from app.llm.observed import ObservedAdapter
from app.llm.routing import resolve_endpoint
from app.llm.types import ModelAdapter, ModelRequest, ResolvedModel
from app.settings import Settings

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)


def _read_model_layer() -> ModelMap:
    """LiteLLM's model map, then the readers' modules, in the loading thread.

    The readers are imported here rather than with this module: their aiohttp costs ~0.1 s of imports
    that a cold start would otherwise spend before /healthz answers, and no model stream is read before
    the layer has loaded. `_load` and `adapter` import from them once this has run.
    """
    models = ModelMap.read()
    importlib.import_module("app.llm.openai_compat")
    importlib.import_module("app.llm.anthropic")
    return models


class UnknownModelError(LookupError):
    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class ModelGateway:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.catalog = ModelCatalog.load(settings.models_file)
        self._models: ModelMap | None = None
        self._demo = DemoAdapter(settings.demo_token_delay)
        # No process yet: the child starts with the first LiteLLM stream.
        self._process = LiteLLMProcess()
        self._litellm_adapter = LiteLLMAdapter(self._process)
        self._http: aiohttp.ClientSession | None = None
        self._loaded = asyncio.Event()
        self._load_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._load(), name="model-gateway-load")

    async def _load(self) -> None:
        try:
            models = await asyncio.to_thread(_read_model_layer)
            from app.llm.openai_compat import new_http_client

            self._http = new_http_client()
            self._models = models
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
        return self._models is not None

    @property
    def litellm_process(self) -> LiteLLMProcess:
        """Where LiteLLM's streams run: its `pid` is None until the first of them."""
        return self._process

    async def ready(self) -> ModelMap:
        await self._loaded.wait()
        if self._models is None:
            raise RuntimeError("the model layer failed to load") from self._load_error
        return self._models

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
        models = await self.ready()
        inner = await self.adapter(model)
        return ObservedAdapter(inner, self._label(models, model.name), _provider(models, model), _estimate)

    def _label(self, models: ModelMap, name: str) -> str:
        """The model as a metric label: names the server knows, else "other" (a label set stays bounded
        even when clients name any model behind a provider prefix)."""
        known = name in DEMO_MODELS or self.catalog.get(name) is not None or name in models.models
        return name if known else "other"

    async def adapter(self, model: ResolvedModel) -> ModelAdapter:
        """Demo in-process; otherwise the models file's `adapter` choice, unless PARLEY_STREAM_ADAPTER
        forces LiteLLM for every model but the demo; "auto" takes the Anthropic reader (anthropic.py) for
        models that route to Anthropic, the lean reader where routing.py finds the model
        OpenAI-compatible, LiteLLM for the rest."""
        models = await self.ready()
        assert self._http is not None
        forced_litellm = self._settings.stream_adapter == "litellm"
        if model.name in DEMO_MODELS:
            return self._demo
        choice = self.catalog.adapter(model.name)
        if forced_litellm or choice == "litellm":
            return self._litellm_adapter
        if choice == "auto":
            from app.llm import anthropic  # loaded by _import_model_modules

            configured = self.catalog.get(model.name)
            native = anthropic.resolve(
                models,
                model,
                max_output_tokens=configured.max_output_tokens if configured is not None else None,
                prompt_cache=configured.prompt_cache if configured is not None else None,
                reasoning_budget=configured.reasoning_budget if configured is not None else None,
            )
            if native is not None:
                return anthropic.AnthropicAdapter(self._http, native)
        configured = self.catalog.get(model.name)
        endpoint = resolve_endpoint(
            models,
            model,
            forced=choice == "openai",
            reasoning_effort=configured.reasoning_effort if configured is not None else None,
        )
        if endpoint is None:
            return self._litellm_adapter
        from app.llm.openai_compat import OpenAICompatAdapter  # loaded by _import_model_modules

        return OpenAICompatAdapter(self._http, endpoint)

    async def is_known(self, model: str) -> bool:
        """Demo, models file, or a model LiteLLM can route (its model map or a known provider prefix)."""
        if model in DEMO_MODELS or self.catalog.get(model) is not None:
            return True
        return (await self.ready()).knows(model)

    async def context_window(self, model: str) -> int | None:
        configured = self.catalog.get(model)
        if configured is not None and configured.context_window is not None:
            return configured.context_window
        if model in DEMO_MODELS:
            return DEMO_MODELS[model]
        info = (await self.ready()).info(model)
        return info.max_input_tokens if info is not None else None

    async def takes_files(self, model: str) -> tuple[bool, bool]:
        """Whether `model` takes (images, documents): the demo takes both; then the models file's `vision`
        and `documents`, then LiteLLM's model map (supports_vision, supports_pdf_input); else neither."""
        if model in DEMO_MODELS:
            return True, True
        configured = self.catalog.get(model)
        info = (await self.ready()).info(model)
        vision = configured.vision if configured is not None else None
        documents = configured.documents if configured is not None else None
        return (
            vision if vision is not None else bool(info and info.vision),
            documents if documents is not None else bool(info and info.pdf),
        )

    async def resolve(self, model: str) -> ResolvedModel:
        return self.catalog.resolve(model, await self.context_window(model))

    def model_names(self) -> list[str]:
        names = [*DEMO_MODELS, *self.catalog.names()]
        return list(dict.fromkeys(names))


def _provider(models: ModelMap, model: ResolvedModel) -> str | None:
    """The provider the model routes to (the spans' gen_ai.provider.name)."""
    if model.name in DEMO_MODELS:
        return "parley"
    routed = models.route(model.name)
    return routed[1] if routed is not None else model.provider


def _estimate(model: str, request: ModelRequest, completion: str) -> tuple[int, int]:
    """Usage for a provider that reported none (marked estimated): tokens.py's count."""
    return tokens.prompt_tokens(request.messages), tokens.text_tokens(completion)
