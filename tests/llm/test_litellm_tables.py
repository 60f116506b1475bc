"""What the launcher knows of LiteLLM's routing without importing it (app.llm.litellm_tables): every name
its files vouch for is one LiteLLM itself routes, the enum read from source is LiteLLM's provider list,
and the check of a models file whose names the files vouch for leaves litellm unimported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from app.llm.checks import model_problems, undecided
from app.llm.litellm_import import import_litellm
from app.llm.litellm_tables import ModelMap, Routes
from app.llm.models_file import ModelCatalog
from tests.support.server import ROOT

# get_llm_provider runs an OAuth device flow for these (over the network), whatever the name.
AUTHENTICATING = {"github_copilot", "chatgpt"}
# LiteLLM validates ragflow's names by a format of their own (ragflow/chat/<id>/<model>): a prefix is not
# enough, and `ragflow/x` is the one prefix the files vouch for that LiteLLM refuses.
OWN_FORMAT = {"ragflow"}


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    return import_litellm()


@pytest.fixture(scope="module")
def routes() -> Routes:
    return Routes.read()


def _routes(litellm: ModuleType, name: str) -> bool:
    try:
        litellm.get_llm_provider(model=name)
    except Exception:
        return False
    return True


def test_the_enum_read_from_source_is_litellms_provider_list(litellm: ModuleType, routes: Routes) -> None:
    # litellm.provider_list starts as this enum, and custom providers registered at runtime (the demo's
    # "parley", a test's own) are appended to it in the process: the enum is what litellm ships.
    providers = {p.value for p in litellm.types.utils.LlmProviders}
    assert providers <= routes.prefixes
    assert len(routes.bare_names) > 50


def test_every_prefix_the_files_vouch_for_is_routed_by_litellm(litellm: ModuleType, routes: Routes) -> None:
    refused = [p for p in sorted(routes.prefixes - AUTHENTICATING) if not _routes(litellm, f"{p}/some-model")]
    assert set(refused) <= OWN_FORMAT, refused


def test_every_bare_name_the_files_vouch_for_is_routed_by_litellm(
    litellm: ModuleType, routes: Routes
) -> None:
    refused = [name for name in sorted(routes.bare_names) if not _routes(litellm, name)]
    assert refused == []


def test_what_the_files_cannot_tell_is_left_to_litellm(
    litellm: ModuleType, routes: Routes, tmp_path: Path
) -> None:
    path = tmp_path / "models.json"
    providers = {
        "hosted": {"models": ["openai/gpt-x", "hosted_vllm/llama", "gpt-4o", "anthropic/claude-next"]},
        # A bare name routed by nothing; one LiteLLM's map lists but routes by its api_base only.
        "local": {"api_base": "http://127.0.0.1:9/v1", "models": ["fake-model"]},
        "deep": {"models": ["deepseek-chat"]},
    }
    path.write_text(json.dumps({"providers": providers}), encoding="utf-8")
    catalog = ModelCatalog.load(path)
    doubtful = undecided(catalog, routes)
    assert doubtful == ["fake-model", "deepseek-chat"]
    assert [p.model for p in model_problems(litellm, catalog, doubtful)] == ["fake-model", "deepseek-chat"]


_CHECK = """
import json, sys
from pathlib import Path
from app.llm.models_file import ModelCatalog
from app.startup import routable

print(json.dumps([routable(ModelCatalog.load(Path(sys.argv[1]))), "litellm" in sys.modules]))
"""


@pytest.mark.slow
def test_a_models_file_the_files_vouch_for_is_checked_without_importing_litellm(tmp_path: Path) -> None:
    """A cold start must not wait seconds for LiteLLM's import before it binds."""
    path = tmp_path / "models.json"
    models = {"openai/gpt-x", "gpt-4o-mini", "hosted_vllm/llama", "ollama_chat/qwen", "parley/demo"}
    path.write_text(json.dumps({"providers": {"p": {"models": sorted(models)}}}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, False]


# --- the model map read as data, against LiteLLM's own answers ---------------------------------------------


@pytest.fixture(scope="module")
def model_map() -> ModelMap:
    return ModelMap.read()


def test_routes_agree_with_litellms_provider_resolution(litellm: ModuleType, model_map: ModelMap) -> None:
    names = [
        *sorted(model_map.routes.bare_names),
        "openai/gpt-4o",
        "anthropic/claude-sonnet-4-5",
        "hosted_vllm/qwen",
        "ollama_chat/llama3.1",
        "deepseek/deepseek-chat",
    ]
    for name in names:
        routed = model_map.route(name)
        assert routed is not None, name
        bare, provider, _, _ = litellm.get_llm_provider(model=name)
        assert routed == (bare, provider), name
    assert model_map.route("fake-model") is None
    assert model_map.route("no-such-provider/x") is None


def test_windows_and_output_limits_agree_with_litellms_model_info(
    litellm: ModuleType, model_map: ModelMap
) -> None:
    chat = sorted(name for name, info in model_map.models.items() if info.mode == "chat" and "/" not in name)
    sample = [*chat[::25], "openai/gpt-4o", "anthropic/claude-sonnet-4-5", "claude-haiku-4-5"]
    for name in sample:
        info = model_map.info(name)
        assert info is not None, name
        known = litellm.get_model_info(name)
        assert info.max_input_tokens == known.get("max_input_tokens"), name
        assert info.max_output_tokens == known.get("max_output_tokens"), name
    assert model_map.info("hosted_vllm/anything") is None
