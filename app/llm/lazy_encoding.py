"""Keeps `import litellm` from loading tiktoken's cl100k_base encoding (~40 MB RSS) until it is used.

litellm's `token_counter` module binds `default_encoding` at import, and the module it comes from builds
the encoding as it loads. Parley never counts tokens on its hot path (providers report usage), so a
stand-in takes that module's place in `sys.modules` before litellm is imported: its `encoding` is a proxy
that imports the real module on first attribute access and delegates to it; any other attribute (the rank
file helpers) loads the real module the same way. After that load the real module is in `sys.modules`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

REAL_MODULE = "litellm.litellm_core_utils.default_encoding"


class _StandIn(ModuleType):
    def __init__(self) -> None:
        super().__init__(REAL_MODULE, "Stand-in until litellm's default encoding is first used.")
        self._lock = threading.Lock()
        self._real: ModuleType | None = None
        self.encoding = LazyEncoding(self)

    def __getattr__(self, name: str) -> Any:
        # Only attributes the stand-in lacks get here; the import system probes dunders such as __path__.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.load(), name)

    @property
    def loaded(self) -> bool:
        return self._real is not None

    def load(self) -> ModuleType:
        with self._lock:
            if self._real is None:
                if sys.modules.get(REAL_MODULE) is self:
                    del sys.modules[REAL_MODULE]
                try:
                    self._real = importlib.import_module(REAL_MODULE)
                except BaseException:
                    sys.modules.setdefault(REAL_MODULE, self)
                    raise
            return self._real


class LazyEncoding:
    """Stands for the `tiktoken.Encoding` litellm binds at import; the first attribute access loads it."""

    __slots__ = ("_module",)

    def __init__(self, module: _StandIn) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module.load().encoding, name)


def install() -> None:
    """Call before `import litellm`; does nothing once litellm (or the real module) is loaded."""
    if "litellm" in sys.modules or REAL_MODULE in sys.modules:
        return
    _set_tiktoken_cache_dir()
    sys.modules[REAL_MODULE] = _StandIn()


def _set_tiktoken_cache_dir() -> None:
    """What the real module does at import: tiktoken reads litellm's bundled rank files, never the network.

    Other encodings (o200k_base for gpt-4o) are loaded by name and need this before the real module loads.
    """
    custom = os.getenv("CUSTOM_TIKTOKEN_CACHE_DIR")
    if custom:
        os.makedirs(custom, exist_ok=True)
        os.environ["TIKTOKEN_CACHE_DIR"] = custom
        return
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.origin is not None:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(Path(spec.origin).parent / "litellm_core_utils" / "tokenizers")


def default_encoding_loaded() -> bool:
    """Whether litellm's default encoding has been built (the stand-in is gone or has loaded it)."""
    module = sys.modules.get(REAL_MODULE)
    if module is None:
        return False
    return module.loaded if isinstance(module, _StandIn) else True
