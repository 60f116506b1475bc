"""Importing litellm, for the LiteLLM child (litellm_child.py) and the launcher's check of a models file
entry LiteLLM's files cannot vouch for (startup.py): the service's own process never imports it otherwise.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType


def import_litellm() -> ModuleType:
    # Without these, import fetches the cost map over the network and offline tokenizer loads stall for
    # tens of seconds (measured on this project's machines). They must be set before the import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.disable_hf_tokenizer_download = True
    logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    module: ModuleType = litellm
    return module
