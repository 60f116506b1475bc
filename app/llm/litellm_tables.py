"""What LiteLLM knows of providers and models, read from its package's files as data, never by importing it
(the import takes seconds and ~170 MB: the service imports LiteLLM only in the child that runs a tail
model's streams, litellm_process.py).

`ModelMap` is LiteLLM's model map (the JSON file it ships): context windows, output limits and the provider
of each model it lists, kept as a small table. `ModelMap.route(name)` is the provider a name goes to and its
bare name, as `litellm.get_llm_provider` answers, wherever these files can tell.

`Routes.knows(name)` is a sure yes or a "cannot tell": yes when `litellm.get_llm_provider` routes the name
by its prefix (a provider of the `LlmProviders` enum, read from its source with `ast`, or of the JSON
providers file) or, for a bare name, by LiteLLM's model map where its tables route that provider's bare
names. Everything else (a bare name routed by its api_base, a name LiteLLM refuses) is for LiteLLM itself
to decide (checks.model_problems). Files that moved in another release only make more names undecided.
tests/llm/test_litellm_tables.py holds every yes against LiteLLM's own answer.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

# Providers whose bare model names LiteLLM routes by its model map (open_ai_chat_completion_models and
# anthropic_models are built from it), and the map's modes a chat model has.
BARE_NAME_PROVIDERS = frozenset({"openai", "anthropic"})
CHAT_MODES = frozenset({"chat", "completion", "responses"})


@dataclass(frozen=True)
class Routes:
    prefixes: frozenset[str]
    bare_names: frozenset[str]

    def knows(self, name: str) -> bool:
        prefix, slash, _ = name.partition("/")
        if slash:
            return prefix in self.prefixes
        return name in self.bare_names

    @classmethod
    def read(cls) -> Routes:
        """From the installed litellm's files; empty (nothing known) when they cannot be read."""
        root = package_root()
        if root is None:
            return cls(frozenset(), frozenset())
        return cls(_prefixes(root), _bare_names(_load_json(root / MAP_FILE)))


MAP_FILE = "model_prices_and_context_window_backup.json"


def package_root() -> Path | None:
    """The installed litellm package's folder, found without running its __init__."""
    spec = importlib.util.find_spec("litellm")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(folders[0]) if folders else None


class ModelInfo(NamedTuple):
    """What Parley reads of one model map entry."""

    provider: str | None
    mode: str | None
    max_input_tokens: int | None
    max_output_tokens: int | None
    vision: bool
    pdf: bool


@dataclass(frozen=True)
class ModelMap:
    """LiteLLM's model map and provider list as data (~4,000 entries read in ~20 ms, kept as tuples)."""

    models: dict[str, ModelInfo]
    routes: Routes

    @classmethod
    def read(cls) -> ModelMap:
        root = package_root()
        if root is None:
            return cls({}, Routes(frozenset(), frozenset()))
        found = _load_json(root / MAP_FILE)
        models = {
            name: ModelInfo(
                _text(entry.get("litellm_provider")),
                _text(entry.get("mode")),
                _positive(entry.get("max_input_tokens")),
                _positive(entry.get("max_output_tokens")),
                entry.get("supports_vision") is True,
                entry.get("supports_pdf_input") is True,
            )
            for name, entry in found.items()
            if isinstance(entry, dict)
        }
        return cls(models, Routes(_prefixes(root), _bare_names(found)))

    def info(self, name: str) -> ModelInfo | None:
        """The entry of `name`, or of its bare name under its provider's prefix ("openai/gpt-4o" is the
        map's "gpt-4o"), as LiteLLM's get_model_info looks it up."""
        found = self.models.get(name)
        if found is not None:
            return found
        prefix, slash, bare = name.partition("/")
        if slash:
            found = self.models.get(bare)
            if found is not None and found.provider == prefix:
                return found
        return None

    def route(self, name: str) -> tuple[str, str] | None:
        """(bare name, provider) where the files tell (a known provider prefix, or a bare name the map routes
        by itself); None where only LiteLLM can decide."""
        prefix, slash, bare = name.partition("/")
        if slash:
            return (bare, prefix) if prefix in self.routes.prefixes else None
        if name in self.routes.bare_names:
            found = self.models[name]
            return (name, found.provider) if found.provider is not None else None
        return None

    def knows(self, name: str) -> bool:
        return name in self.models or self.routes.knows(name)


def _prefixes(root: Path) -> frozenset[str]:
    return _enum_values(root / "types" / "utils.py", "LlmProviders") | _json_keys(
        root / "llms" / "openai_like" / "providers.json"
    )


def _load_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _enum_values(path: Path, enum: str) -> frozenset[str]:
    """The string members of the class `enum` in `path`, read line by line: `NAME = "value"` lines of its
    body, up to the next line at the module's level. Not with `ast`: on Python 3.11 before 3.11.8 two threads
    building syntax trees at once can fail with "AST constructor recursion depth mismatch" (CPython
    gh-106905), and this runs in a worker thread beside anything else that compiles."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return frozenset()
    header = re.compile(rf"class {re.escape(enum)}\b")
    values: set[str] = set()
    inside = False
    for line in lines:
        if not inside:
            inside = header.match(line) is not None
            continue
        if line and not line[0].isspace() and not line.startswith("#"):
            break
        member = _MEMBER.match(line)
        if member is not None:
            values.add(member.group(1))
    return frozenset(values)


_MEMBER = re.compile(r"""\s+[A-Za-z_][A-Za-z0-9_]*\s*=\s*["']([^"'\\]*)["']\s*(?:#.*)?$""")


def _json_keys(path: Path) -> frozenset[str]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return frozenset()
    return frozenset(found) if isinstance(found, dict) else frozenset()


def _bare_names(found: dict[str, Any]) -> frozenset[str]:
    return frozenset(
        name
        for name, entry in found.items()
        if "/" not in name
        and not name.startswith("ft:")  # fine-tuned names route by LiteLLM's own patterns, not the map
        and isinstance(entry, dict)
        and entry.get("litellm_provider") in BARE_NAME_PROVIDERS
        and entry.get("mode") in CHAT_MODES
    )
