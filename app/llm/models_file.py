"""The models file (docs/configuration.md, Use a real model): providers with their base URL, key and
context windows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.llm.types import ResolvedModel

AdapterChoice = Literal["auto", "openai", "litellm"]
"""How a provider's stream is read: "auto" picks the lean OpenAI-compatible reader where LiteLLM routes the
model to an OpenAI-compatible chat-completions endpoint, "openai" forces that reader, "litellm" forces
LiteLLM's own stream."""


ReasoningEffort = Literal["minimal", "low", "medium", "high"]
# Extended thinking's budget for an effort where only the effort is given (LiteLLM's own mapping).
EFFORT_BUDGETS: dict[str, int] = {"minimal": 1024, "low": 1024, "medium": 2048, "high": 4096}


class ReasoningEntry(BaseModel):
    """How much the model may think before it answers (docs/configuration.md, Reasoning): Anthropic's
    thinking budget, or the `reasoning_effort` OpenAI-compatible reasoning models take; one or both."""

    model_config = ConfigDict(extra="forbid")

    budget_tokens: int | None = Field(None, ge=1024)
    effort: ReasoningEffort | None = None

    @model_validator(mode="after")
    def _something(self) -> ReasoningEntry:
        if self.budget_tokens is None and self.effort is None:
            raise ValueError("reasoning needs budget_tokens (Anthropic) or effort (OpenAI-compatible)")
        return self

    @property
    def budget(self) -> int:
        """The thinking budget for Anthropic: the given one, else the effort's."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        assert self.effort is not None
        return EFFORT_BUDGETS[self.effort]


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_window: int | None = Field(None, gt=0)
    # Read by the Anthropic reader only (anthropic.py); None leaves them to the provider entry, then to
    # the defaults (the known max output, else 4096; caching on).
    max_output_tokens: int | None = Field(None, gt=0)
    prompt_cache: bool | None = None
    # Extended thinking (Anthropic) or reasoning effort (OpenAI-compatible); None: off.
    reasoning: ReasoningEntry | None = None
    # Whether the model takes images and documents (PDF) as attachments (docs/files.md); None leaves it to
    # the provider entry, then to LiteLLM's model map (supports_vision, supports_pdf_input).
    vision: bool | None = None
    documents: bool | None = None


class ProviderEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_base: str | None = None
    api_key_env: str | None = None
    context_window: int | None = Field(None, gt=0)
    max_output_tokens: int | None = Field(None, gt=0)
    prompt_cache: bool | None = None
    vision: bool | None = None
    documents: bool | None = None
    adapter: AdapterChoice = "auto"
    models: list[str] | dict[str, ModelEntry] = Field(default_factory=list)

    def entries(self) -> dict[str, ModelEntry]:
        if isinstance(self.models, list):
            repeated = sorted({name for name in self.models if self.models.count(name) > 1})
            if repeated:
                raise ModelsFileError(f"model {repeated[0]!r} is listed twice")
            return {name: ModelEntry() for name in self.models}
        return dict(self.models)


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    providers: dict[str, ProviderEntry] = Field(default_factory=dict)


class ModelsFileError(ValueError):
    pass


class ConfiguredModel(BaseModel):
    """A model named in the models file; `context_window` is None when the file leaves it to LiteLLM."""

    name: str
    provider: str
    api_base: str | None
    api_key_env: str | None
    context_window: int | None
    adapter: AdapterChoice = "auto"
    max_output_tokens: int | None = None
    prompt_cache: bool | None = None
    reasoning_budget: int | None = None
    reasoning_effort: ReasoningEffort | None = None
    vision: bool | None = None
    documents: bool | None = None


class ModelCatalog:
    """Configured models by name. Knows nothing of LiteLLM: the model layer completes the chain."""

    def __init__(self, models: dict[str, ConfiguredModel]) -> None:
        self._models = models

    @classmethod
    def load(cls, path: Path | None) -> ModelCatalog:
        if path is None:
            return cls({})
        try:
            parsed = ModelsFile.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, ValidationError) as exc:
            raise ModelsFileError(f"cannot use models file {path}: {exc}") from exc
        models: dict[str, ConfiguredModel] = {}
        for provider_name, provider in parsed.providers.items():
            try:
                entries = provider.entries()
            except ModelsFileError as exc:
                raise ModelsFileError(f"models file {path}: {exc}") from exc
            for model_name, entry in entries.items():
                if model_name in models:
                    raise ModelsFileError(f"models file {path}: model {model_name!r} is listed twice")
                models[model_name] = ConfiguredModel(
                    name=model_name,
                    provider=provider_name,
                    api_base=provider.api_base,
                    api_key_env=provider.api_key_env,
                    context_window=entry.context_window or provider.context_window,
                    adapter=provider.adapter,
                    max_output_tokens=entry.max_output_tokens or provider.max_output_tokens,
                    prompt_cache=provider.prompt_cache if entry.prompt_cache is None else entry.prompt_cache,
                    reasoning_budget=entry.reasoning.budget if entry.reasoning else None,
                    reasoning_effort=entry.reasoning.effort if entry.reasoning else None,
                    vision=provider.vision if entry.vision is None else entry.vision,
                    documents=provider.documents if entry.documents is None else entry.documents,
                )
        return cls(models)

    def get(self, name: str) -> ConfiguredModel | None:
        return self._models.get(name)

    def names(self) -> list[str]:
        return list(self._models)

    def adapter(self, name: str) -> AdapterChoice:
        configured = self._models.get(name)
        return configured.adapter if configured is not None else "auto"

    def resolve(self, name: str, fallback_window: int | None) -> ResolvedModel:
        """Model entry > provider entry > the fallback (LiteLLM's table) > unknown."""
        configured = self._models.get(name)
        if configured is None:
            return ResolvedModel(name=name, context_window=fallback_window)
        key = os.environ.get(configured.api_key_env) if configured.api_key_env else None
        return ResolvedModel(
            name=name,
            context_window=configured.context_window or fallback_window,
            api_base=configured.api_base,
            api_key=key,
            provider=configured.provider,
            key_env=configured.api_key_env,
        )
