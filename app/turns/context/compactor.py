"""A turn's compaction (docs/context.md): before each model call, the view the planner chooses, with the
summary it asks for written by a model call, and what changed announced to the recorder.

The record is never touched: the agent keeps its whole history in memory and sends the view. A summary is
written whole or not at all: a stop cancels the summary's model call, and nothing of it is kept until the
recorder stores it with the `context_compacted` event that announces it, in one transaction.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from app.llm import tokens
from app.llm.types import ModelAdapter, ModelRequest, ResolvedModel, TextPart
from app.settings import Settings
from app.turns.context.planner import FOLD_TARGET, Block, Policy, Summary, View, plan

# What a refused call is planned with on its retry: a smaller budget, and only the running turn kept.
HARDER_BUDGET = 0.7
# A summary's length asked of the summariser, in words, and the characters of each message it reads.
SUMMARY_WORDS = 250
EXCERPT_CHARS = 600
# The summariser's tokens beside the transcript: the summary so far, its answer, the instruction.
SUMMARY_ROOM = 2 * 400 + 150
SUMMARY_INSTRUCTION = (
    "You maintain the running summary of a conversation between a user and an AI assistant that uses "
    "tools. Rewrite the summary so that it also covers the new part of the conversation: keep the facts, "
    "decisions, names, numbers, open questions and what the user wants, drop small talk. Answer with the "
    f"summary only, at most {SUMMARY_WORDS} words. [summary request]"
)
# The scale a session starts with before any provider reported a prompt's tokens: estimates run low for
# chatty JSON framing, so the first call plans with some room.
FIRST_SCALE = 1.15
# A reported count moves the scale (and the session's stored one) only by more than this share: not a
# write per response for the noise of one prompt.
RECALIBRATE = 0.02


def resolve_policy(stored: Any, settings: Settings) -> Policy:
    """A session's policy: what it stored (its `context` column), the settings' defaults for the rest."""
    given = stored if isinstance(stored, dict) else {}
    return Policy(
        strategy="off" if given.get("strategy", settings.context_strategy) == "off" else "auto",
        keep_turns=int(given.get("keep_turns") or settings.context_keep_turns),
        reserve_tokens=int(given.get("reserve_tokens", settings.context_reserve_tokens)),
    )


def budget_of(policy: Policy, window: int | None) -> int | None:
    """The tokens a prompt may take: the window less the room reserved for the answer (None: unknown)."""
    return None if window is None else max(1, window - policy.reserve_tokens)


def may_need_summary(policy: Policy, window: int | None, messages: list[dict[str, Any]]) -> bool:
    """Whether a summary may apply: a summary is written only for a history past the budget, and a history
    under half of it (the fold target) has none to apply. Spares the turns of short sessions a read."""
    budget = budget_of(policy, window)
    if policy.strategy == "off" or budget is None:
        return False
    return tokens.prompt_tokens(messages) > budget * FOLD_TARGET / 2


def new_summary_id() -> str:
    return "cs_" + os.urandom(8).hex()


@dataclass(frozen=True, slots=True)
class ContextCompacted:
    """The agent's event, before the model call it applies to: what that call sends instead of the
    whole history. `written`: the summary is new (the recorder stores it with the event)."""

    tokens_before: int
    tokens_after: int
    summary: Summary | None
    written: bool
    elided_tool_call_ids: tuple[str, ...]
    elided_file_ids: tuple[str, ...] = ()
    # When written: the summary it extends, and the model that wrote it.
    previous_summary_id: str | None = None
    summary_model: str = ""


@dataclass
class SummaryModel:
    """Who writes summaries: an adapter and its model (the session's, or PARLEY_CONTEXT_SUMMARY_MODEL)."""

    adapter: ModelAdapter
    model: ResolvedModel
    timeout: float = 120.0

    async def write(self, previous: str | None, transcript: str) -> str:
        parts = [f"The summary so far:\n{previous}" if previous else "There is no summary yet."]
        parts.append(f"The new part of the conversation:\n{transcript}")
        messages = [
            {"role": "system", "content": SUMMARY_INSTRUCTION},
            {"role": "user", "content": "\n\n".join(parts) + "\n\n[summary request]"},
        ]
        request = ModelRequest(self.model, messages, [], self.timeout)
        text: list[str] = []
        async with aclosing(self.adapter.stream(request)) as stream:
            async for part in stream:
                if isinstance(part, TextPart):
                    text.append(part.text)
        return "".join(text).strip() or "(nothing to keep)"


class Compactor:
    """One turn's compaction state: the policy, the window, the summary in force and the calibration."""

    def __init__(
        self,
        policy: Policy,
        window: int | None,
        turns: Sequence[tuple[str, ...]],
        summariser: SummaryModel,
        *,
        summary: Summary | None = None,
        scale: float | None = None,
        files: Sequence[Mapping[int, Mapping[str, Any]]] = (),
    ) -> None:
        """`turns` and `files` are aligned with the turn's messages as `plan` takes them."""
        self.policy = policy
        self.window = window
        self.turns = list(turns)
        self.files = list(files)
        self.summariser = summariser
        self.summary = summary
        self.scale = scale if scale is not None else FIRST_SCALE
        self._overhead = 0
        self._announced: tuple[str | None, tuple[str, ...], tuple[str, ...]] | None = None
        # The raw estimate of the last view sent: a reported prompt count calibrates the scale by it.
        self.sent_estimate: int | None = None
        self._sent_attachments = False

    @property
    def budget(self) -> int | None:
        return budget_of(self.policy, self.window)

    async def view(
        self, messages: list[dict[str, Any]], *, overhead: int = 0, harder: bool = False
    ) -> AsyncGenerator[ContextCompacted | View, None]:
        """Yields a ContextCompacted when the view differs from the last one announced, then the View.
        `overhead`: the tokens the request spends beside its messages (the tools' schemas)."""
        self._overhead = overhead
        policy, budget = self.policy, self.budget
        if harder and budget is not None:
            policy = Policy(policy.strategy, 1, policy.reserve_tokens)
            budget = int(budget * HARDER_BUDGET)
        written = False
        previous = self.summary.id if self.summary is not None else None
        chosen = self._plan(messages, policy, budget, may_fold=True)
        for _ in range(2):  # a summary that still leaves too much asks for one more, then elision decides
            if not chosen.fold:
                break
            summary = await self._summarise(messages, chosen.fold)
            # Extending one written by this very call: the row stored extends the one the turn had.
            self.summary, written = summary, True
            chosen = self._plan(messages, policy, budget, may_fold=True)
        if chosen.fold:
            chosen = self._plan(messages, policy, budget, may_fold=False)
        full = self._plan(messages, Policy("off"), None, may_fold=False)
        self.sent_estimate = tokens.prompt_tokens(chosen.messages) + self._overhead
        # Providers count an image by its pixels and a document by its pages, which the estimate does not
        # know: a prompt that sends one calibrates nothing (else the text's scale would follow its error).
        self._sent_attachments = _attaches(chosen.messages)
        state = (
            chosen.summary.id if chosen.summary else None,
            chosen.elided_tool_call_ids,
            chosen.elided_file_ids,
        )
        compacted = any(state)
        if (compacted or self._announced is not None) and state != self._announced:
            self._announced = state
            yield ContextCompacted(
                tokens_before=full.tokens,
                tokens_after=chosen.tokens,
                summary=chosen.summary,
                written=written,
                elided_tool_call_ids=chosen.elided_tool_call_ids,
                elided_file_ids=chosen.elided_file_ids,
                previous_summary_id=previous if written else None,
                summary_model=self.summariser.model.name,
            )
        yield chosen

    def calibrate(self, reported_prompt_tokens: int) -> float | None:
        """The provider's count of what was sent over the estimate of it: later views plan with it. The
        new scale when it moved by more than RECALIBRATE (the session keeps it), else None."""
        if not self.sent_estimate or reported_prompt_tokens <= 0 or self._sent_attachments:
            return None
        scale = min(4.0, max(0.5, reported_prompt_tokens / self.sent_estimate))
        if abs(scale - self.scale) <= RECALIBRATE * self.scale:
            return None
        self.scale = scale
        return scale

    def _plan(
        self, messages: list[dict[str, Any]], policy: Policy, budget: int | None, *, may_fold: bool
    ) -> View:
        return plan(
            messages,
            self.turns,
            budget=budget,
            policy=policy,
            summary=self.summary,
            scale=self.scale,
            overhead=self._overhead,
            may_fold=may_fold,
            files=self.files,
        )

    async def _summarise(self, messages: list[dict[str, Any]], fold: Sequence[Block]) -> Summary:
        offset = 1 if messages and messages[0].get("role") == "system" else 0
        folded = [messages[offset + i] for block in fold for i in range(block.start, block.end)]
        # What the summariser may read, shared by the folded messages: each shortened alike, so that the
        # oldest are read as well as the newest.
        limit = self._transcript_chars()
        each = max(80, min(EXCERPT_CHARS, limit // max(1, len(folded))))
        transcript = "\n".join(line for line in (_line(m, each) for m in folded) if line)[:limit]
        previous = self.summary.content if self.summary is not None else None
        content = await self.summariser.write(previous, transcript)
        turn_ids = list(self.summary.turn_ids if self.summary is not None else ())
        for block in fold:
            turn_ids.extend(t for t in block.turn_ids if t not in turn_ids)
        return Summary(new_summary_id(), content, tuple(turn_ids))

    def _transcript_chars(self) -> int:
        """What the summariser may read: its window less the summary so far, its answer and instruction
        (SUMMARY_ROOM), in characters, with room for a count above the estimate."""
        window = self.summariser.model.context_window or self.window or 8192
        return max(1000, int((window - SUMMARY_ROOM) * tokens.CHARS_PER_TOKEN / 1.5))


def _attaches(messages: list[dict[str, Any]]) -> bool:
    return any(
        tokens.part_tokens(part)
        for message in messages
        if message.get("role") == "user" and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict)
    )


def _line(message: dict[str, Any], limit: int) -> str:
    role = message.get("role")
    text = tokens.content_text(message.get("content")).strip()
    if len(text) > limit:
        text = text[:limit] + f" [... {len(text) - limit} more characters]"
    if role == "tool":
        return f"tool result ({message.get('tool_call_id')}): {text}"
    functions = [c.get("function") or {} for c in message.get("tool_calls") or ()]
    calls = [f"{f.get('name')}({json.dumps(f.get('arguments'))[:200]})" for f in functions]
    said = f"{role}: {text}" if text else ""
    if calls:
        said = (said + " " if said else f"{role}: ") + "calls " + ", ".join(calls)
    return said
