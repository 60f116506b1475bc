"""The models file (app.llm.models_file) and the whole context-window chain through the model layer.

Chain (docs/configuration.md): model entry > provider entry > LiteLLM's table > unknown (None).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.llm.gateway import ModelGateway
from app.llm.models_file import ModelCatalog, ModelsFileError
from app.llm.types import ResolvedModel
from app.settings import DEMO_MODEL, Settings

KEY_ENV = "PARLEY_TEST_CATALOG_KEY"
OTHER_KEY_ENV = "PARLEY_TEST_CATALOG_OTHER_KEY"


def write(tmp_path: Path, content: Any, name: str = "models.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


MODELS: dict[str, Any] = {
    "providers": {
        "house": {
            "api_base": "http://127.0.0.1:9/v1",
            "api_key_env": KEY_ENV,
            "context_window": 200000,
            "models": {"house-big": {"context_window": 32768}, "house-plain": {}},
        },
        "listed": {
            "api_base": "http://127.0.0.1:10/v1",
            "api_key_env": OTHER_KEY_ENV,
            "context_window": 64000,
            "models": ["list-a", "list-b"],
        },
        "bare": {"models": ["bare-model"]},
    }
}


@pytest.fixture
def catalog(tmp_path: Path) -> ModelCatalog:
    return ModelCatalog.load(write(tmp_path, MODELS))


# --- loading and resolving -------------------------------------------------------------------------------


def test_model_entry_beats_provider_entry(catalog: ModelCatalog) -> None:
    assert catalog.resolve("house-big", 1_000_000).context_window == 32768


def test_provider_entry_applies_to_models_without_their_own(catalog: ModelCatalog) -> None:
    assert catalog.resolve("house-plain", 1_000_000).context_window == 200000
    assert catalog.resolve("list-a", 1_000_000).context_window == 64000
    assert catalog.resolve("list-b", None).context_window == 64000


def test_a_file_model_without_any_window_uses_the_fallback(catalog: ModelCatalog) -> None:
    assert catalog.resolve("bare-model", 4096).context_window == 4096
    assert catalog.resolve("bare-model", None).context_window is None


def test_api_base_provider_and_key_resolve(catalog: ModelCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-house-123")
    monkeypatch.delenv(OTHER_KEY_ENV, raising=False)
    assert catalog.resolve("house-big", None) == ResolvedModel(
        name="house-big",
        context_window=32768,
        api_base="http://127.0.0.1:9/v1",
        api_key="sk-house-123",
        provider="house",
        key_env=KEY_ENV,
    )
    listed = catalog.resolve("list-a", None)
    assert (listed.api_base, listed.provider, listed.api_key) == ("http://127.0.0.1:10/v1", "listed", None)
    bare = catalog.resolve("bare-model", None)
    assert (bare.api_base, bare.provider, bare.api_key) == (None, "bare", None)


def test_the_key_is_read_when_resolving_not_when_loading(
    catalog: ModelCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert catalog.resolve("house-plain", None).api_key is None
    monkeypatch.setenv(KEY_ENV, "sk-later")
    assert catalog.resolve("house-plain", None).api_key == "sk-later"


def test_a_model_not_in_the_file_falls_back(catalog: ModelCatalog) -> None:
    assert catalog.get("gpt-4o-mini") is None
    assert catalog.resolve("gpt-4o-mini", 128000) == ResolvedModel(name="gpt-4o-mini", context_window=128000)
    assert catalog.resolve("nothing-known", None) == ResolvedModel(name="nothing-known", context_window=None)


def test_names_and_get(catalog: ModelCatalog) -> None:
    assert catalog.names() == ["house-big", "house-plain", "list-a", "list-b", "bare-model"]
    configured = catalog.get("list-b")
    assert configured is not None
    assert (configured.provider, configured.api_key_env, configured.context_window) == (
        "listed",
        OTHER_KEY_ENV,
        64000,
    )


def test_the_adapter_is_a_provider_setting_auto_by_default(tmp_path: Path) -> None:
    content = {
        "providers": {
            "plain": {"models": ["a"]},
            "lean": {"adapter": "openai", "models": ["b"]},
            "own": {"adapter": "litellm", "models": {"c": {}}},
        }
    }
    catalog = ModelCatalog.load(write(tmp_path, content))
    assert [catalog.adapter(name) for name in ("a", "b", "c", "not-in-the-file")] == [
        "auto",
        "openai",
        "litellm",
        "auto",
    ]


def test_max_output_tokens_and_prompt_cache_model_entry_first(tmp_path: Path) -> None:
    content = {
        "providers": {
            "claude": {
                "max_output_tokens": 2000,
                "prompt_cache": False,
                "models": {
                    "anthropic/a": {},
                    "anthropic/b": {"max_output_tokens": 500, "prompt_cache": True},
                },
            },
            "plain": {"models": ["anthropic/c"]},
        }
    }
    catalog = ModelCatalog.load(write(tmp_path, content))
    found = {}
    for name in ("anthropic/a", "anthropic/b", "anthropic/c"):
        configured = catalog.get(name)
        assert configured is not None
        found[name] = (configured.max_output_tokens, configured.prompt_cache)
    assert found == {"anthropic/a": (2000, False), "anthropic/b": (500, True), "anthropic/c": (None, None)}
    with pytest.raises(ModelsFileError):
        ModelCatalog.load(write(tmp_path, {"providers": {"p": {"max_output_tokens": 0, "models": ["x"]}}}))


def test_reasoning_is_per_model_and_off_by_default(tmp_path: Path) -> None:
    content: dict[str, Any] = {
        "providers": {
            "claude": {
                "models": {"anthropic/think": {"reasoning": {"budget_tokens": 4000}}, "anthropic/plain": {}}
            },
            "o": {"models": {"openai/o4-mini": {"reasoning": {"effort": "high"}}}},
        }
    }
    catalog = ModelCatalog.load(write(tmp_path, content))
    budgets = {name: getattr(catalog.get(name), "reasoning_budget", "?") for name in catalog.names()}
    # An effort alone gives Anthropic the effort's budget too (high: 4096), as LiteLLM maps it.
    assert budgets == {"anthropic/think": 4000, "anthropic/plain": None, "openai/o4-mini": 4096}
    efforts = {name: getattr(catalog.get(name), "reasoning_effort", "?") for name in catalog.names()}
    assert efforts == {"anthropic/think": None, "anthropic/plain": None, "openai/o4-mini": "high"}
    for wrong in ({"budget_tokens": 100}, {"effort": "huge"}, {}, {"effort": "low", "extra": 1}):
        bad = {"providers": {"p": {"models": {"x": {"reasoning": wrong}}}}}
        with pytest.raises(ModelsFileError):
            ModelCatalog.load(write(tmp_path, bad))


def test_no_file_and_empty_files_mean_no_models(tmp_path: Path) -> None:
    assert ModelCatalog.load(None).names() == []
    assert ModelCatalog.load(write(tmp_path, {})).names() == []
    assert ModelCatalog.load(write(tmp_path, {"providers": {"p": {}}}, "p.json")).names() == []


# --- invalid files ---------------------------------------------------------------------------------------

INVALID: dict[str, Any] = {
    "bad_json": '{"providers": {"p": {"models": ["a",]}}}',
    "not_an_object": "[1, 2]",
    "unknown_top_key": {"providers": {}, "defaults": {}},
    "unknown_provider_key": {"providers": {"p": {"base_url": "http://x", "models": ["a"]}}},
    "unknown_model_key": {"providers": {"p": {"models": {"a": {"window": 1000}}}}},
    "negative_model_window": {"providers": {"p": {"models": {"a": {"context_window": -1}}}}},
    "zero_model_window": {"providers": {"p": {"models": {"a": {"context_window": 0}}}}},
    "negative_provider_window": {"providers": {"p": {"context_window": -5, "models": ["a"]}}},
    "window_not_a_number": {"providers": {"p": {"models": {"a": {"context_window": "big"}}}}},
    "listed_in_two_providers": {"providers": {"p": {"models": ["a"]}, "q": {"models": {"a": {}}}}},
    "unknown_adapter": {"providers": {"p": {"adapter": "httpx", "models": ["a"]}}},
    "adapter_on_a_model": {"providers": {"p": {"models": {"a": {"adapter": "openai"}}}}},
}


@pytest.mark.parametrize("content", INVALID.values(), ids=INVALID.keys())
def test_invalid_files_raise_naming_the_file(tmp_path: Path, content: Any) -> None:
    path = write(tmp_path, content, "broken-models.json")
    with pytest.raises(ModelsFileError, match=r"broken-models\.json") as caught:
        ModelCatalog.load(path)
    assert str(path) in str(caught.value)


def test_a_model_listed_in_two_providers_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, INVALID["listed_in_two_providers"])
    with pytest.raises(ModelsFileError, match=r"'a' is listed twice"):
        ModelCatalog.load(path)


def test_a_model_listed_twice_in_one_list_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, {"providers": {"p": {"context_window": 1000, "models": ["a", "b", "a"]}}})
    with pytest.raises(ModelsFileError, match=r"models\.json: model 'a' is listed twice"):
        ModelCatalog.load(path)


def test_a_missing_file_raises_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(ModelsFileError, match=r"absent\.json"):
        ModelCatalog.load(path)


# --- the whole chain through the model layer -------------------------------------------------------------

CHAIN: dict[str, Any] = {
    "providers": {
        "house": {
            "api_base": "http://127.0.0.1:9/v1",
            "api_key_env": KEY_ENV,
            "context_window": 200000,
            # gpt-4o has its own (tiny) window here: the file beats LiteLLM's table.
            "models": {
                "house-big": {"context_window": 32768},
                "house-plain": {},
                "gpt-4o": {"context_window": 1000},
            },
        },
        # No window anywhere: LiteLLM's table decides, or nobody does.
        "openai": {"models": ["gpt-4.1-mini", "local-llama"]},
    }
}


@pytest.fixture
async def layer(tmp_path: Path) -> AsyncIterator[ModelGateway]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}",
        models_file=write(tmp_path, CHAIN),
        demo_token_delay=0.0,
    )
    model_layer = ModelGateway(settings)
    model_layer.start()
    await model_layer.ready()
    yield model_layer
    await model_layer.stop()


def litellm_window(model: str) -> int:
    from app.llm.litellm_import import import_litellm

    value = import_litellm().get_model_info(model)["max_input_tokens"]
    assert isinstance(value, int)
    assert value > 0
    return value


@pytest.mark.anyio
async def test_context_window_chain(layer: ModelGateway) -> None:
    assert layer.is_ready
    assert await layer.context_window("house-big") == 32768  # model entry
    assert await layer.context_window("house-plain") == 200000  # provider entry
    assert litellm_window("gpt-4o") != 1000
    assert await layer.context_window("gpt-4o") == 1000  # the file beats LiteLLM's table
    assert await layer.context_window("gpt-4.1-mini") == litellm_window("gpt-4.1-mini")  # file, no window
    assert await layer.context_window("gpt-4o-mini") == litellm_window("gpt-4o-mini")  # not in the file
    assert await layer.context_window("openai/some-local-model") is None
    assert await layer.context_window("local-llama") is None  # in the file, but nobody knows its window
    assert await layer.context_window(DEMO_MODEL) == 32768


@pytest.mark.anyio
async def test_resolve_through_the_layer(layer: ModelGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-chain")
    assert await layer.resolve("house-plain") == ResolvedModel(
        name="house-plain",
        context_window=200000,
        api_base="http://127.0.0.1:9/v1",
        api_key="sk-chain",
        provider="house",
        key_env=KEY_ENV,
    )
    assert await layer.resolve("gpt-4o-mini") == ResolvedModel(
        name="gpt-4o-mini", context_window=litellm_window("gpt-4o-mini")
    )
    assert await layer.resolve("openai/some-local-model") == ResolvedModel(
        name="openai/some-local-model", context_window=None
    )
    demo = await layer.resolve(DEMO_MODEL)
    assert demo.context_window == 32768
    assert demo.api_key is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("model", "known"),
    [
        (DEMO_MODEL, True),
        ("house-big", True),
        ("house-plain", True),
        ("local-llama", True),
        ("gpt-4o-mini", True),
        ("openai/anything", True),
        ("no-such-model-xyz", False),
        ("no-such-provider/model", False),
        ("", False),
    ],
)
async def test_is_known(layer: ModelGateway, model: str, known: bool) -> None:
    assert await layer.is_known(model) is known


@pytest.mark.anyio
async def test_model_names_list_demo_then_the_file(layer: ModelGateway) -> None:
    assert layer.model_names() == [
        DEMO_MODEL,
        "parley/demo-small",
        "house-big",
        "house-plain",
        "gpt-4o",
        "gpt-4.1-mini",
        "local-llama",
    ]


@pytest.mark.anyio
async def test_a_broken_models_file_stops_the_layer_at_construction(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}",
        models_file=write(tmp_path, INVALID["negative_model_window"], "bad.json"),
    )
    with pytest.raises(ModelsFileError, match=r"bad\.json"):
        ModelGateway(settings)
