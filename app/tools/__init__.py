"""LLM-callable tools: the registry that describes and runs them, and the safe built-in tools.

Import the public API from here; `build_default_registry()` gives each app its own registry.
"""

from app.tools.registry import (
    Tool,
    ToolContext,
    ToolOutcome,
    ToolRegistry,
    UnknownToolError,
    build_default_registry,
)

__all__ = [
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolRegistry",
    "UnknownToolError",
    "build_default_registry",
]
