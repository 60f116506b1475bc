"""One turn's execution: the agent built for the session as it is now, run by its recorder to the end.

Every way out of a turn closes it exactly once: the recorder closes what it ran; what fails or is
stopped before it takes charge (reading the history, resolving the model) is closed here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from app.llm.gateway import ModelGateway
from app.settings import Settings
from app.storage import repository
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.tools.registry import ToolRegistry
from app.turns.agent import AgentRun
from app.turns.prompt import rebuild
from app.turns.recorder import TurnRecorder, failure_of

log = logging.getLogger(__name__)


class AgentFactory:
    """Builds a turn's agent: the session's history as the model's prompt, its model and its tools."""

    def __init__(
        self, settings: Settings, database: Database, models: ModelGateway, tools: ToolRegistry
    ) -> None:
        self._settings = settings
        self._database = database
        self._models = models
        self._tools = tools

    async def prepare(
        self, session: ChatSessionRow, turn_id: str, *, should_pause: Callable[[], bool]
    ) -> AgentRun:
        """`session` is the row the turn was started with, read just before (a deleted session stops its
        turn first, and an update between that read and this moment is not seen: the next turn sees it)."""
        async with self._database.session() as db:
            rows = await repository.list_messages(db, session.id)
        model = await self._models.resolve(session.model)
        adapter = await self._models.observed_adapter(model)
        settings = self._settings
        return AgentRun(
            adapter=adapter,
            model=model,
            tools=self._tools,
            tool_names=list(session.tools),
            messages=rebuild(rows, session.system_prompt),
            session_id=session.id,
            turn_id=turn_id,
            max_rounds=settings.max_tool_rounds,
            tool_timeout=settings.tool_timeout,
            provider_timeout=settings.provider_timeout,
            retries=settings.provider_retries,
            retry_backoff=settings.provider_retry_backoff,
            should_pause=should_pause,
        )


async def run_turn(prepare: Coroutine[Any, Any, AgentRun], recorder: TurnRecorder) -> None:
    """Prepares the agent and records it to the turn's end."""
    try:
        if recorder.begin():
            prepare.close()  # stopped before the task took its first step: nothing ran
            raise asyncio.CancelledError
        await recorder.record(await prepare)
    except asyncio.CancelledError:
        # Stopped before the recorder took charge (the turn had not reached the model yet).
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await _end_safely(recorder, recorder.finish_cancelled)
    except Exception as exc:
        code, message = failure_of(exc, recorder.turn_id, logger=log, what="could not run")
        await _end_safely(recorder, lambda: recorder.finish_failed(code, message))


async def _end_safely(recorder: TurnRecorder, end: Callable[[], Awaitable[None]]) -> None:
    """The turn's end, written even if storage refuses it for a while (end_durably). Any other failure
    while closing is logged: the session must still become free for the next turn."""
    try:
        await recorder.end_durably(end)
    except Exception:
        log.exception("closing turn %s failed", recorder.turn_id)
