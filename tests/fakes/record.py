"""What the fake upstream remembers of each request: `RecordedRequest`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecordedRequest:
    """One request as the server saw it. Times are `time.monotonic()` (comparable across threads and,
    on Linux, across processes). Fields after `tag` are filled in by the server's thread as it answers."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None when the body was empty or not JSON
    received_at: float
    connection: int = 0  # the connection it came on, numbered from 1 in the order they were opened
    tag: str | None = None  # the `[bench tag=...]` of its last user message, if any
    status: int | None = None  # set when the first byte of the answer is written
    finished_at: float | None = None  # response fully sent, cut by the script, or client gone
    disconnected: bool = False  # the client went away before the response was complete
    disconnected_at: float | None = None
    cut: bool = False  # the script dropped the connection on purpose
    chunks_sent: int = 0  # SSE events written (role chunk and [DONE] included; none with `trickle`)
    content_sent: int = 0  # text and tool-call chunks among them
    first_content_at: float | None = None  # when the first of those was written
    problems: list[str] = field(default_factory=list)  # strict-mode findings that produced a 400

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
