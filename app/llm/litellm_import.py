"""Importing litellm the one safe way, for the service's model gateway (gateway.py) and the LiteLLM child
(litellm_child.py) alike: offline settings before the import, quiet settings after it, and the collector
kept off the ~350k objects it creates.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Iterator
from types import ModuleType

from app.llm import lazy_encoding


@contextlib.contextmanager
def frozen_afterwards(when: bool = True) -> Iterator[None]:
    """No collection while the block builds long-lived objects; afterwards they go to the permanent
    generation, out of every later full collection. Does nothing unless `when` and the collector is on."""
    pausing = when and gc.isenabled()
    if pausing:
        gc.disable()
    try:
        yield
    finally:
        if pausing:
            gc.freeze()
            gc.enable()


def import_litellm() -> ModuleType:
    # Without these, import fetches the cost map over the network and offline tokenizer loads stall for
    # tens of seconds (measured on this project's machines). They must be set before the import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    first_import = "litellm" not in sys.modules
    # tiktoken's default encoding (~40 MB) is built on first use instead of at import.
    lazy_encoding.install()
    # The import creates ~350k long-lived objects. While it runs, the collector's full passes over them
    # held the GIL for 85-590 ms each (measured): the event loop, answering health meanwhile, stalled.
    # So no collection during the import (it leaves ~2,000 garbage objects, measured), and afterwards the
    # lot goes to the permanent generation: later full collections walk only what the service allocates
    # (a full pass then took 0.1 ms instead of 560).
    with frozen_afterwards(first_import):
        import litellm

    litellm.suppress_debug_info = True
    litellm.disable_hf_tokenizer_download = True
    logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    module: ModuleType = litellm
    return module
