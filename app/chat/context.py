"""What a session's next model call would send (GET /v1/sessions/{session_id}/context, docs/context.md):
the active path's history planned as a turn plans it, with that path's summary, and no summary written;
an image or a document is shown by its file's URL, not its bytes (turns.attachments, by_reference)."""

from __future__ import annotations

from typing import Any

from app.llm.gateway import ModelGateway
from app.protocol.schemas import ContextPolicyOut, ContextSummaryOut, SessionContext
from app.settings import Settings
from app.storage import compaction, repository, turn_tree
from app.storage.blobs import Blobs
from app.storage.engine import Database
from app.storage.tables import ChatSessionRow
from app.turns.attachments import pdf_text_limit, with_files
from app.turns.context.compactor import FIRST_SCALE, budget_of, resolve_policy
from app.turns.context.planner import Policy, Summary, blocks, plan
from app.turns.prompt import rebuild


async def next_call(
    settings: Settings, database: Database, blobs: Blobs, models: ModelGateway, session: ChatSessionRow
) -> SessionContext:
    async with database.read() as db:
        # The active path only: the next turn follows the head, and another branch's turns (and their
        # summaries) are none of its prompt.
        head = await turn_tree.head(db, session.id)
        rows = await repository.list_messages(db, session.id, through_turn=head) if head is not None else []
        found = await compaction.summary_for(db, session.id, [r.turn_id for r in rows])
    turns: list[tuple[str, ...]] = []
    attached: list[dict[int, dict[str, Any]]] = []
    prompt = rebuild(rows, session.system_prompt, turns)
    limit = await pdf_text_limit(settings, models, session.model)  # as the turn sends it
    messages = await with_files(database, blobs, prompt, attached, by_reference=True, pdf_text_limit=limit)
    policy = resolve_policy(session.context, settings)
    window = (await models.resolve(session.model)).context_window
    budget = budget_of(policy, window)
    scale = session.context_scale or FIRST_SCALE
    summary = Summary(found.id, found.content, tuple(found.turn_ids)) if found is not None else None
    whole = plan(messages, turns, budget=None, policy=Policy("off"), scale=scale)
    view = plan(
        messages,
        turns,
        budget=budget,
        policy=policy,
        summary=summary if policy.strategy == "auto" else None,
        scale=scale,
        files=attached,
    )
    summarized = set(view.summarized_turn_ids)
    has_system = bool(messages) and messages[0].get("role") == "system"
    cut = blocks(messages[1:] if has_system else messages, turns[1:] if has_system else turns)
    return SessionContext(
        policy=ContextPolicyOut(
            strategy=policy.strategy, keep_turns=policy.keep_turns, reserve_tokens=policy.reserve_tokens
        ),
        model=session.model,
        context_window=window,
        budget_tokens=budget,
        history_tokens=whole.tokens,
        sent_tokens=view.tokens,
        compaction_due=bool(view.fold) or not view.fits,
        summary=ContextSummaryOut(
            id=found.id,
            content=found.content,
            summarized_turn_ids=list(found.turn_ids),
            model=found.model,
            created_at=found.created_at,
        )
        if found is not None and view.summary is not None
        else None,
        elided_tool_call_ids=list(view.elided_tool_call_ids),
        elided_file_ids=list(view.elided_file_ids),
        verbatim_turn_ids=[b.key for b in cut if b.key not in summarized],
        messages=view.messages,
    )
