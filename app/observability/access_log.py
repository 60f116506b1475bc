"""Keeps API keys out of the access log.

uvicorn's access log prints each request's path with its query string, and the event stream accepts the
key as `?access_token=` (EventSource cannot send headers), so the key would land in every log line of
every stream. A filter on the "uvicorn.access" logger replaces the value before any handler formats it.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

SECRET_PARAMS = frozenset({"access_token"})
REDACTED = "[redacted]"
_PAIR = re.compile(r"(?P<lead>[?&])(?P<name>[^=&#\s\"]*)=(?P<value>[^&#\s\"]*)")


def redact_query(text: str) -> str:
    """`text` with the value of every secret query parameter (however its name is percent-encoded) hidden."""

    def replace(match: re.Match[str]) -> str:
        if unquote_plus(match["name"]) in SECRET_PARAMS:
            return f"{match['lead']}{match['name']}={REDACTED}"
        return match[0]

    return _PAIR.sub(replace, text)


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


def install_access_log_redaction() -> None:
    """Idempotent. A filter on the logger survives uvicorn's logging set-up, which replaces handlers."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactSecrets) for f in logger.filters):
        logger.addFilter(RedactSecrets())
