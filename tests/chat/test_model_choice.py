"""The models a session may choose (app.chat.model_choice.list_models): the demo model, the models
file's, and the default when nothing configures it, each with its source, provider and context window,
through a loaded model layer (LiteLLM gives the windows the file leaves out). The file itself:
tests/llm/test_models_file.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.chat.model_choice import list_models
from app.llm.demo import DEMO_CONTEXT_WINDOW, DEMO_SMALL_CONTEXT_WINDOW, DEMO_SMALL_MODEL
from app.llm.gateway import ModelGateway
from app.settings import DEMO_MODEL, Settings

pytestmark = pytest.mark.anyio

MODELS: dict[str, Any] = {
    "providers": {
        "house": {
            "api_base": "http://127.0.0.1:9/v1",
            "context_window": 64000,
            "models": {"house-big": {"context_window": 32000}, "house-plain": {}},
        },
        "bare": {"models": ["gpt-4o"]},  # no window in the file: LiteLLM's
    }
}
DEMO = {"model": DEMO_MODEL, "provider": "parley", "context_window": DEMO_CONTEXT_WINDOW, "source": "demo"}
# The small-window demo (docs/context.md), listed after the demo.
SMALL = {
    "model": DEMO_SMALL_MODEL,
    "provider": "parley",
    "context_window": DEMO_SMALL_CONTEXT_WINDOW,
    "source": "demo",
}
FROM_FILE = [
    {"model": "house-big", "provider": "house", "context_window": 32000, "source": "models_file"},
    {"model": "house-plain", "provider": "house", "context_window": 64000, "source": "models_file"},
    {"model": "gpt-4o", "provider": "bare", "context_window": 128000, "source": "models_file"},
]


@pytest.fixture(scope="module")
def models_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "models.json"
    path.write_text(json.dumps(MODELS), encoding="utf-8")
    return path


@pytest.fixture
def configured(models_file: Path, tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}", models_file=models_file)


async def listed(settings: Settings) -> list[dict[str, Any]]:
    models = ModelGateway(settings)
    models.start()
    try:
        await models.ready()
        found = await list_models(settings, models)
    finally:
        await models.stop()
    assert found.default_model == settings.default_model
    return [info.model_dump() for info in found.models]


async def test_the_demo_and_the_models_files_models_in_order(configured: Settings) -> None:
    assert await listed(configured) == [DEMO, SMALL, *FROM_FILE]  # the demo is the default: listed once


async def test_a_default_that_nothing_configures_is_listed_last(configured: Settings) -> None:
    known = configured.model_copy(update={"default_model": "gpt-4o-mini"})
    unknown = configured.model_copy(update={"default_model": "no-such-model-anywhere"})
    assert await listed(known) == [
        DEMO,
        SMALL,
        *FROM_FILE,
        {"model": "gpt-4o-mini", "provider": None, "context_window": 128000, "source": "default"},
    ]
    assert (await listed(unknown))[-1] == {
        "model": "no-such-model-anywhere",
        "provider": None,
        "context_window": None,
        "source": "default",
    }


async def test_a_default_from_the_models_file_is_not_listed_twice(configured: Settings) -> None:
    assert await listed(configured.model_copy(update={"default_model": "house-big"})) == [
        DEMO,
        SMALL,
        *FROM_FILE,
    ]
