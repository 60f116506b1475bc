"""What of a turn is open while it runs: the response that streams (its id, its text not yet written for
good) and the calls of the current tool round (those started, those whose tool_group row has no result
yet). The recorder fills it from the agent's events; a stop or a failure closes what it holds
(TurnEnds), and a turn resumed after a restart adopts it from its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.storage.tables import ChatMessageRow
from app.streaming.log.texts import TextBuffer
from app.turns.agent import CallRequest


@dataclass
class OpenTool:
    row_id: str
    name: str
    source: str = "builtin"


@dataclass
class OpenRound:
    response_id: str | None = None
    text: TextBuffer | None = None
    # The response's reasoning row while it streams (written behind like its text).
    reasoning: TextBuffer | None = None
    # Calls whose tool_group row is written and has no result yet, by call id (calls that wait too).
    tools: dict[str, OpenTool] = field(default_factory=dict)
    # The calls of the current tool round, so a stop can give the ones not started yet their result.
    calls: list[CallRequest] = field(default_factory=list)
    started: set[str] = field(default_factory=set)

    def adopt(self, rows: Sequence[ChatMessageRow]) -> None:
        """A turn resumed after a restart: its last round's calls without a result are open again."""
        self.response_id = rows[0].response_id if rows else None
        self.calls = [CallRequest(r.tool_call_id or "", r.tool_name or "", "") for r in rows]
        self.started = {call.id for call in self.calls}
        self.tools = {
            r.tool_call_id or "": OpenTool(r.id, r.tool_name or "") for r in rows if r.result is None
        }
