"""Startup checks of the models file, for the launcher: what would otherwise fail at every turn.

`undecided` names the entries LiteLLM's files (read without importing it: litellm_tables) do not show to be
routable, and only for those `model_problems`
asks LiteLLM's own provider resolution (`litellm.get_llm_provider`) about every entry, the question each
turn asks later: a name without a provider LiteLLM knows (`fake-model` with no prefix) is refused with the
fix, instead of being listed, accepted and failing each turn with a misleading `provider_bad_request`.
`missing_keys` names the entries whose `api_key_env` variable is unset (such a model is called without a
key of its own, never with a placeholder one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType

from app.llm.demo import DEMO_MODELS
from app.llm.litellm_tables import Routes
from app.llm.models_file import ConfiguredModel, ModelCatalog


@dataclass(frozen=True, slots=True)
class ModelProblem:
    model: str
    message: str


def undecided(catalog: ModelCatalog, routes: Routes) -> list[str]:
    """The entries whose routing LiteLLM's files (litellm_tables) do not vouch for: LiteLLM decides."""
    return [name for name in catalog.names() if name not in DEMO_MODELS and not routes.knows(name)]


def model_problems(
    litellm: ModuleType, catalog: ModelCatalog, names: list[str] | None = None
) -> list[ModelProblem]:
    """Entries (of `names`, else all) LiteLLM cannot route, each with the fix."""
    problems: list[ModelProblem] = []
    for name in catalog.names() if names is None else names:
        configured = catalog.get(name)
        if name in DEMO_MODELS or configured is None:
            continue
        try:
            litellm.get_llm_provider(model=name, api_base=configured.api_base)
        except Exception:
            problems.append(ModelProblem(name, _routing_fix(configured)))
    return problems


def _routing_fix(model: ConfiguredModel) -> str:
    bare = model.name.split("/", 1)[-1] if "/" in model.name else model.name
    where = f" (provider entry {model.provider!r})"
    if model.api_base:
        return (
            f"model {model.name!r}{where} has no provider prefix LiteLLM knows: for an OpenAI-compatible "
            f"server at {model.api_base} name it 'openai/{bare}' (or 'hosted_vllm/{bare}', "
            f"'ollama_chat/{bare}', ...)"
        )
    return (
        f"model {model.name!r}{where} has no provider prefix LiteLLM knows: name it with one, such as "
        f"'openai/{bare}' or 'anthropic/{bare}', or give the entry the api_base of an OpenAI-compatible "
        "server"
    )


def missing_keys(catalog: ModelCatalog) -> list[ModelProblem]:
    """Entries whose api_key_env names an unset (or empty) variable."""
    problems: list[ModelProblem] = []
    for name in catalog.names():
        configured = catalog.get(name)
        if configured is None or not configured.api_key_env:
            continue
        if not os.environ.get(configured.api_key_env):
            problems.append(
                ModelProblem(
                    name,
                    f"model {name!r} (provider entry {configured.provider!r}) takes its key from "
                    f"{configured.api_key_env}, which is not set: its calls go without a configured key",
                )
            )
    return problems
