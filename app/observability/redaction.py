"""Keeping what Parley sends a provider out of what it logs of the provider's answer.

Self-hosted servers and gateways echo the request in their errors, the `Authorization` header among
them; Parley logs those answers (HTTP status lines, mid-stream errors, LiteLLM's exceptions) to help an
operator. `redact` removes from a text

* every secret Parley holds in its environment: the value of each variable whose name says it is one
  (`KEY`, `TOKEN`, `SECRET`, `PASSWORD`, `CREDENTIAL` in it: provider keys, `api_key_env` variables, the
  tools file's `${...}` secrets), read when a line is logged, so a key set later is covered too;
* what looks like a credential whatever its source: a bearer token, the value of an `Authorization`,
  `api-key` or `x-api-key` field, an `sk-...` key.

`RedactingFilter` applies it to a log record (its message and its traceback); `redact_provider_logs`
puts it on every logger that logs a provider's answer, in this process and, through the same logger
names, for the records the LiteLLM child sends up.
"""

from __future__ import annotations

import logging
import os
import re

__all__ = ["MARKER", "PROVIDER_LOGGERS", "RedactingFilter", "redact", "redact_provider_logs"]

MARKER = "[redacted]"
PROVIDER_LOGGERS = (
    "app.llm.openai_compat",
    "app.llm.provider_errors",
    "app.llm.litellm_child",
    "app.llm.litellm_process",
    "app.llm.gateway",
    "app.llm.routing",
    "LiteLLM",
    "LiteLLM Router",
)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_MIN_SECRET = 8  # shorter values would redact ordinary words
_PATTERNS = (
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+"),
    re.compile(
        r"""(?i)(\b(?:authorization|proxy-authorization|x-api-key|api[-_]?key)\b["']?\s*[:=]\s*["']?)"""
        r"""(?!bearer\s)(?!\[redacted\])[^\s"',;}]+"""
    ),
    re.compile(r"()\bsk-[A-Za-z0-9_-]{16,}"),
)


def _environment_secrets() -> list[str]:
    values = {
        value for name, value in os.environ.items() if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET
    }
    return sorted(values, key=len, reverse=True)  # a longer secret first: it may hold a shorter one


def redact(text: str) -> str:
    """The text without the secrets Parley holds or anything that looks like a credential."""
    for secret in _environment_secrets():
        if secret in text:
            text = text.replace(secret, MARKER)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda match: match.group(1) + MARKER, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and traceback) redacted; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def redact_provider_logs() -> None:
    """Puts the filter on every logger that logs a provider's answer (once, however often called)."""
    for name in PROVIDER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
