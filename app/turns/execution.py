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
from app.llm.types import ModelAdapter, ResolvedModel
from app.settings import Settings
from app.storage import compaction, repository
from app.storage.blobs import Blobs
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, ChatSessionRow, ContextSummaryRow
from app.tools.registry import ToolRegistry
from app.turns.agent import AgentRun
from app.turns.attachments import pdf_text_limit, with_files
from app.turns.context.compactor import Compactor, SummaryModel, may_need_summary, resolve_policy
from app.turns.context.planner import Summary
from app.turns.pending_calls import Inbox
from app.turns.prompt import rebuild
from app.turns.recorder import TurnRecorder, failure_of
from app.turns.rounds import WaitRules
from app.turns.suspended import client_tool_schema, edit_problem, resumed_round, turn_client_tools

log = logging.getLogger(__name__)


class AgentFactory:
    """Builds a turn's agent: the session's history as the model's prompt, its model and its tools."""

    def __init__(
        self,
        settings: Settings,
        database: Database,
        models: ModelGateway,
        tools: ToolRegistry,
        blobs: Blobs,
    ) -> None:
        self._settings = settings
        self._database = database
        self._blobs = blobs
        self._models = models
        self._tools = tools

    async def prepare(
        self,
        session: ChatSessionRow,
        turn_id: str,
        *,
        should_pause: Callable[[], bool],
        inbox: Inbox | None = None,
        resuming: bool = False,
        history: list[ChatMessageRow] | None = None,
    ) -> AgentRun:
        """`session` is the row the turn was started with, read just before (a deleted session stops its
        turn first, and an update between that read and this moment is not seen: the next turn sees it).
        `resuming`: the turn was suspended before a restart; its waiting round goes on first. `history`:
        the session's rows, when the turn holds them all already (the opening of a session's first turn
        wrote them: TurnRows.history); else they are read. The notes of the user messages that started the
        turn (what the frontend tells the model: AG-UI's context) follow the system prompt, in this turn's
        prompt only."""
        plan = None
        if history is not None and not resuming:
            rows = history
        else:
            async with self._database.read() as db:
                rows = await repository.list_messages(db, session.id, through_turn=turn_id)
                plan = await resumed_round(db, turn_id, rows) if resuming else None
        turns: list[tuple[str, ...]] = []
        system = "\n\n".join(p for p in (session.system_prompt, *_opening_notes(rows, turn_id)) if p) or None
        attached: list[dict[int, dict[str, Any]]] = []
        limit = await pdf_text_limit(self._settings, self._models, session.model)
        messages = await with_files(
            self._database, self._blobs, rebuild(rows, system, turns), attached, pdf_text_limit=limit
        )
        if plan is not None:
            # The round's results enter the history when it ends, in call order.
            while messages and messages[-1]["role"] == "tool":
                messages.pop()
                turns.pop()
                attached.pop()
        client_tools = turn_client_tools(session, rows, turn_id)
        model = await self._models.resolve(session.model)
        adapter = await self._models.observed_adapter(model)
        compactor = None
        policy = resolve_policy(session.context, self._settings)
        if policy.strategy == "auto":
            summary = None
            if may_need_summary(policy, model.context_window, messages):
                async with self._database.read() as db:
                    found = await compaction.summary_for(db, session.id, [r.turn_id for r in rows])
                summary = _summary(found)
            compactor = Compactor(
                policy,
                model.context_window,
                turns,
                await self._summariser(model, adapter),
                summary=summary,
                scale=session.context_scale,
                files=attached,
            )
        settings = self._settings
        return AgentRun(
            adapter=adapter,
            model=model,
            tools=self._tools,
            tool_names=list(session.tools),
            messages=messages,
            session_id=session.id,
            turn_id=turn_id,
            max_rounds=settings.max_tool_rounds,
            tool_timeout=settings.tool_timeout,
            provider_timeout=settings.provider_timeout,
            retries=settings.provider_retries,
            retry_backoff=settings.provider_retry_backoff,
            retry_max_wait=settings.provider_retry_max_wait,
            should_pause=should_pause,
            client_tools=[client_tool_schema(t) for t in client_tools],
            wait_rules=self._wait_rules(session, client_tools),
            inbox=inbox,
            resume=plan,
            compactor=compactor,
        )

    async def _summariser(self, model: ResolvedModel, adapter: ModelAdapter) -> SummaryModel:
        """The session's model, or PARLEY_CONTEXT_SUMMARY_MODEL when set."""
        name = self._settings.context_summary_model
        if name is not None and name != model.name:
            model = await self._models.resolve(name)
            adapter = await self._models.observed_adapter(model)
        return SummaryModel(adapter, model, self._settings.provider_timeout)

    def _wait_rules(self, session: ChatSessionRow, client_tools: list[dict[str, Any]]) -> WaitRules:
        tools = self._tools
        # Only the session's own names: which calls they (and the tools file) guard is decided from the
        # tool each call resolves to, by the registry (AgentRun asks it, and it holds the rule where the
        # tool runs), not from how the session spelled its selection.
        return WaitRules(
            client_tools=frozenset(t["name"] for t in client_tools),
            approval=frozenset(session.approval),
            client_timeout=self._settings.client_tool_timeout,
            approval_timeout=self._settings.approval_timeout,
            validate=lambda name, arguments: edit_problem(tools, name, arguments),
        )


def _summary(row: ContextSummaryRow | None) -> Summary | None:
    return Summary(row.id, row.content, tuple(row.turn_ids)) if row is not None else None


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


def _opening_notes(rows: list[ChatMessageRow], turn_id: str) -> list[str]:
    """The notes of the user messages that started the turn (a message steered in later joins a prompt
    built already, live or resumed, so its note is not read)."""
    notes: list[str] = []
    for row in rows:
        if row.turn_id != turn_id or row.type == "turn_start":
            continue
        if row.role != "user":
            break
        if row.note:
            notes.append(row.note)
    return notes
