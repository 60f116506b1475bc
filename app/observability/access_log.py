"""Keeps API keys out of the access log.

uvicorn's access log prints each request's path with its query string, as the client sent it, and the
event stream accepts the key as `?access_token=` (EventSource cannot send headers), so the key would land
in every log line of every stream. A filter on the "uvicorn.access" logger replaces the value before any
handler formats it, and before LiteLLM's filter (added when litellm is imported, after this one) sees it.

The value is what the server reads as the key: everything from the `=` to the next `&`, whatever its
characters or their encoding (a key may hold `"`, `?`, `=` and the like, unencoded, as curl sends them).
Only the end of a formatted request line (the space before `HTTP/1.1`) also ends it; a request target
holds no space, and a key none either.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

SECRET_PARAMS = frozenset({"access_token"})
REDACTED = "[redacted]"
_PAIR = re.compile(r"(?<=[?&])(?P<name>[^=&\s]*)=[^&\s]*")


def redact_query(text: str) -> str:
    """`text` with the value of every secret query parameter hidden, however it and its name are encoded
    (and whatever the name's case: the server ignores `Access_Token=`, but a key is a key).

    The name is written decoded: a line that showed `access%5Ftoken=` would look like a secret only once
    decoded, and LiteLLM's filter would then drop the whole query, `after=` and `format=` too.
    """

    def replace(match: re.Match[str]) -> str:
        name = unquote_plus(match["name"])
        return f"{name}={REDACTED}" if name.lower() in SECRET_PARAMS else match[0]

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
