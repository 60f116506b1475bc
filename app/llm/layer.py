"""The model layer: the only owner of the litellm module, loaded off the event loop at startup.

`import litellm` costs seconds and ~190 MB; health, history and streams must not wait for it, so it is
imported in a worker thread and everything that needs a model awaits `ready()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from types import ModuleType

from app.llm.catalog import Catalog
from app.llm.litellm_adapter import LiteLLMAdapter
from app.llm.types import ModelAdapter, ResolvedModel
from app.settings import DEMO_MODEL, Settings

log = logging.getLogger(__name__)


def import_litellm() -> ModuleType:
    # Without these, import fetches the cost map over the network and offline tokenizer loads stall for
    # tens of seconds (../shared/notes/litellm.md §0, §5). They must be set before the import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.disable_hf_tokenizer_download = True
    logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    module: ModuleType = litellm
    return module


class UnknownModelError(LookupError):
    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class ModelLayer:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.catalog = Catalog.load(settings.models_file)
        self._litellm: ModuleType | None = None
        self._adapter: ModelAdapter | None = None
        self._loaded = asyncio.Event()
        self._load_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._load(), name="model-layer-load")

    async def _load(self) -> None:
        try:
            module = await asyncio.to_thread(import_litellm)
            from app.llm.demo import register_demo

            register_demo(self._settings.demo_token_delay)
            self._litellm = module
            self._adapter = LiteLLMAdapter(module)
        except BaseException as exc:
            log.exception("loading the model layer failed")
            self._load_error = exc
            raise
        finally:
            self._loaded.set()

    @property
    def is_ready(self) -> bool:
        return self._adapter is not None

    async def ready(self) -> ModuleType:
        await self._loaded.wait()
        if self._litellm is None:
            raise RuntimeError("the model layer failed to load") from self._load_error
        return self._litellm

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def adapter(self, model: ResolvedModel) -> ModelAdapter:
        await self.ready()
        assert self._adapter is not None
        return self._adapter

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
