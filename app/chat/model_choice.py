"""The models a session may choose: the models file's, the demo model, and the default."""

from __future__ import annotations

from app.llm.demo import DEMO_MODELS
from app.llm.gateway import ModelGateway
from app.protocol.schemas import ModelInfo, ModelList
from app.settings import Settings


async def list_models(settings: Settings, models: ModelGateway) -> ModelList:
    infos = []
    for name in models.model_names():
        configured = models.catalog.get(name)
        infos.append(
            ModelInfo(
                model=name,
                provider=configured.provider if configured else ("parley" if name in DEMO_MODELS else None),
                context_window=await models.context_window(name),
                source="models_file" if configured else "demo",
            )
        )
    default = settings.default_model
    if default not in models.model_names():
        infos.append(
            ModelInfo(
                model=default,
                provider=None,
                context_window=await models.context_window(default),
                source="default",
            )
        )
    return ModelList(models=infos, default_model=default)
