"""The domain's errors: what the runtime and use-case layers raise when they refuse or cannot do a request.

Each carries a `code` (its class's, one class per code), a message, optional `details` and, when waiting
helps, `retry_after` in whole seconds; never an HTTP status or header. The API edge (app.api.errors) maps
each code to its status and headers in one table, and renders every error as
{"error": {"code", "message", "details", "request_id"}}. An error that crosses replicas travels as
`wire()` and is rebuilt by `from_wire` as the same class. See docs/api.md, "Errors".
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

_KINDS: dict[str, type[DomainError]] = {}


class DomainError(Exception):
    """A refusal, or a failure the client may retry. A subclass that declares `code` is the one kind of
    error with that code; a subclass without its own `code` is a family (`Unavailable`, `AnswerRefused`).

    `server_side`: the server could not do the work now (unavailable, timed out), as opposed to a refusal
    of what the request asks; a refused request did nothing, a failed one may have done part of it."""

    code: ClassVar[str] = ""
    server_side: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if code:
            taken = _KINDS.setdefault(code, cls)
            if taken is not cls and taken.__qualname__ != cls.__qualname__:
                raise TypeError(f"error code {code!r} is {taken.__qualname__}'s, not {cls.__qualname__}'s")
            _KINDS[code] = cls

    def __init__(self, message: str, *, details: Any = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        if not self.code:
            raise TypeError(f"{type(self).__qualname__} has no code: raise one of its kinds")
        self.message = message
        self.retry_after = retry_after
        # The body names the wait too, beside the Retry-After header the edge sends.
        self.details = {**(details or {}), "retry_after": retry_after} if retry_after is not None else details

    def wire(self) -> dict[str, Any]:
        """The error as JSON, to cross replicas: its code, message, details and retry_after."""
        return {
            "code": self.code,
            "message": self.message,
            "details": self.details,
            "retry_after": self.retry_after,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> DomainError:
        """The error `wire()` gave, as the same class (a code this build does not know: an internal error)."""
        kind = _KINDS.get(str(wire.get("code")))
        if kind is None:
            raise RuntimeError(f"an error of unknown code crossed replicas: {wire!r}")
        return kind._restore(str(wire["message"]), wire.get("details"), wire.get("retry_after"))

    @classmethod
    def _restore(cls, message: str, details: Any, retry_after: int | None) -> Self:
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        error.message, error.details, error.retry_after = message, details, retry_after
        return error


def error_kinds() -> dict[str, type[DomainError]]:
    """Every code a domain error can carry, with its class (those of the modules imported so far)."""
    return dict(_KINDS)


class InvalidRequest(DomainError):
    """A request the schema lets through but that is not valid: rendered as the validation errors are."""

    code = "validation_error"

    def __init__(self, field: str, message: str, type_: str) -> None:
        details = [{"field": field, "message": message, "type": type_}]
        super().__init__("The request is not valid.", details=details)


class NotFound(DomainError):
    code = "not_found"


class Conflict(DomainError):
    code = "conflict"


class Unavailable(DomainError):
    """The server cannot do it now; `retry_after`, when given, says when to try again."""

    code = "unavailable"
    server_side = True


class PayloadTooLarge(DomainError):
    code = "payload_too_large"


class WaitTimeout(DomainError):
    """A `?wait=true` request's limit passed first: the turn goes on; its id lets the client wait again."""

    code = "wait_timeout"
    server_side = True


class ClientClosedRequest(DomainError):
    """The client closed the connection while it waited: logged, never seen by anyone."""

    code = "client_closed_request"


class Unauthorized(DomainError):
    code = "unauthorized"


class InvalidToken(DomainError):
    """A bearer token that was checked and refused; `details.reason` names the check that failed (never a
    piece of the token)."""

    code = "invalid_token"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, details={"reason": reason})


class TooManyRequests(DomainError):
    """Over a per-principal allowance: `retry_after` whole seconds until there is room again."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)


class TooManyStreams(TooManyRequests):
    code = "too_many_streams"


class StorageUnavailable(Unavailable):
    """The database refused work: its write lock held past the busy timeout (`StorageBusy`), its disk
    full (`StorageFull`), an I/O error (`StorageFailed`), or PostgreSQL out of reach
    (`StorageOutOfReach`). A request gets it with a time to retry after; a turn that meets it ends with
    an `error` of the same code once storage works again."""

    code = ""  # a family: raise one of its kinds

    def again(self, message: str) -> Self:
        """The same refusal (kind and wait) told with another message."""
        return type(self)(message, retry_after=self.retry_after if self.retry_after is not None else 1)


class StorageBusy(StorageUnavailable):
    code = "storage_busy"


class StorageFull(StorageUnavailable):
    code = "storage_full"


class StorageFailed(StorageUnavailable):
    code = "storage_error"


class StorageOutOfReach(StorageUnavailable):
    code = "storage_unavailable"


# Seconds a client is told to wait: a write lock is usually held for milliseconds, while a full disk waits
# for someone to free space; PostgreSQL out of reach: the pool reconnects by itself.
STORAGE_BUSY_RETRY_AFTER = 1
STORAGE_FULL_RETRY_AFTER = 30
STORAGE_UNAVAILABLE_RETRY_AFTER = 2
