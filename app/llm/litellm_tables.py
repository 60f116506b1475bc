"""What LiteLLM's provider resolution knows, read from its package's files without importing it (the import
takes seconds; the launcher checks the models file before it binds, and a cold start must not wait for it).

`Routes.knows(name)` is a sure yes or a "cannot tell": yes when `litellm.get_llm_provider` routes the name
by its prefix (a provider of the `LlmProviders` enum, read from its source with `ast`, or of the JSON
providers file) or, for a bare name, by LiteLLM's model map where its tables route that provider's bare
names. Everything else (a bare name routed by its api_base, a name LiteLLM refuses) is for LiteLLM itself
to decide (checks.model_problems). Files that moved in another release only make more names undecided.
tests/llm/test_litellm_tables.py holds every yes against LiteLLM's own answer.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

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
        spec = importlib.util.find_spec("litellm")  # finds the package without running it
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        if not folders:
            return cls(frozenset(), frozenset())
        root = Path(folders[0])
        return cls(
            _enum_values(root / "types" / "utils.py", "LlmProviders")
            | _json_keys(root / "llms" / "openai_like" / "providers.json"),
            _bare_names(root / "model_prices_and_context_window_backup.json"),
        )


def _enum_values(path: Path, enum: str) -> frozenset[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == enum:
            return frozenset(
                statement.value.value
                for statement in node.body
                if isinstance(statement, ast.Assign)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            )
    return frozenset()


def _json_keys(path: Path) -> frozenset[str]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return frozenset()
    return frozenset(found) if isinstance(found, dict) else frozenset()


def _bare_names(path: Path) -> frozenset[str]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return frozenset()
    if not isinstance(found, dict):
        return frozenset()
    return frozenset(
        name
        for name, entry in found.items()
        if "/" not in name
        and not name.startswith("ft:")  # fine-tuned names route by LiteLLM's own patterns, not the map
        and isinstance(entry, dict)
        and entry.get("litellm_provider") in BARE_NAME_PROVIDERS
        and entry.get("mode") in CHAT_MODES
    )
