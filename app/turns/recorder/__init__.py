"""The turn recorder: the only writer of a turn's rows and events, one TurnRecorder made of parts
(turns.recorder.recorder says which). Recovery and the sweeper close a turn left open with its ends alone
(TurnEnds over TurnRows)."""

from app.turns.recorder.recorder import TurnRecorder, failure_of
from app.turns.recorder.stop import (
    TOOL_INTERRUPTED_BY_ERROR,
    TOOL_INTERRUPTED_BY_RESTART,
    TOOL_INTERRUPTED_BY_USER,
)

__all__ = [
    "TOOL_INTERRUPTED_BY_ERROR",
    "TOOL_INTERRUPTED_BY_RESTART",
    "TOOL_INTERRUPTED_BY_USER",
    "TurnRecorder",
    "failure_of",
]
