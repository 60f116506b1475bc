"""The context planner: from a session's prompt (the whole history, rebuilt) to the prompt a model call
sends, within a token budget, never changing the history itself (docs/context.md).

Pure: no I/O, no clock. The history is cut into blocks, one per turn (its user message and everything
the agent did until the next turn's user message; a steer taken mid-turn stays in its turn's block), so
an assistant message is never separated from its tool calls and their results. Cheapest first:

1. a summary already written applies: the blocks it covers are replaced by it (in the system message);
2. old, bulky tool results are replaced by a placeholder that keeps the call id, and old attached images
   and documents by a placeholder that names the file;
3. the oldest whole blocks are folded into the summary: the plan names them, the caller has them
   summarised and plans again with the new summary;
4. the last `keep_turns` blocks are never folded. Their tool results are sent verbatim, except when the
   kept blocks alone take more than the fold target: then the bulky results of the kept blocks before the
   running turn's go before any fold (else every later turn would fold one more block, a summary call per
   turn); and as the last resort, when nothing else is left, any result past LAST_RESORT_TOKENS, the
   running turn's last.

Token counts are app/llm/tokens.py's estimate times `scale`, the provider's own count of an earlier
prompt over the estimate of the same prompt (1.0 without one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.llm import tokens

Strategy = Literal["auto", "off"]
# A tool result this long (estimated tokens) is bulky: elided from old turns first.
BULKY_TOKENS = 200
# When nothing else is left, tool results of the kept turns past this size are elided too.
LAST_RESORT_TOKENS = 40
# Folding goes down to this share of the budget, so that a summary is written once every several turns
# rather than at every turn once the window is full.
FOLD_TARGET = 0.5
# The room a summary is planned to take when deciding how much to fold (a share of the budget).
SUMMARY_SHARE = 0.15
SUMMARY_HEADING = "Summary of the earlier conversation (written by a model; the messages it replaces are "
SUMMARY_HEADING += "kept in the session's history):"


@dataclass(frozen=True)
class Policy:
    strategy: Strategy = "auto"
    keep_turns: int = 4
    reserve_tokens: int = 1024


@dataclass(frozen=True)
class Summary:
    """A running summary: the turns it covers, the last of which keys it."""

    id: str
    content: str
    turn_ids: tuple[str, ...]

    @property
    def through_turn_id(self) -> str:
        return self.turn_ids[-1]


@dataclass(frozen=True)
class Block:
    """One turn's messages: messages[start:end] of the prompt (the system message excluded)."""

    turn_ids: tuple[str, ...]
    start: int
    end: int

    @property
    def key(self) -> str:
        return self.turn_ids[-1]


@dataclass(frozen=True)
class View:
    """What a model call sends, and what it left out."""

    messages: list[dict[str, Any]]
    tokens: int
    fits: bool
    summary: Summary | None = None
    elided_tool_call_ids: tuple[str, ...] = ()
    elided_file_ids: tuple[str, ...] = ()
    # Blocks to fold into a new summary before this call; empty when the view is final.
    fold: tuple[Block, ...] = ()

    @property
    def summarized_turn_ids(self) -> tuple[str, ...]:
        return self.summary.turn_ids if self.summary is not None else ()


@dataclass
class _Prompt:
    """The prompt being planned, with each message's token count kept up to date."""

    system: dict[str, Any] | None
    body: list[dict[str, Any]]
    sizes: list[int]
    scale: float
    overhead: int
    # Each message's attached images and documents, by their index in its content (aligned with body).
    files: Sequence[Mapping[int, Mapping[str, Any]]] = ()
    elided: dict[int, dict[str, Any]] = field(default_factory=dict)
    # What the elisions left out: a tool result's call id, or an attachment's file ids, by message.
    calls: dict[int, str] = field(default_factory=dict)
    file_ids: dict[int, list[str]] = field(default_factory=dict)

    def tokens(self, start: int, summary: Summary | None) -> int:
        system = _system(self.system, summary)
        raw = tokens.PROMPT_OVERHEAD + self.overhead + sum(self.sizes[start:])
        if system is not None:
            raw += tokens.prompt_tokens([system]) - tokens.PROMPT_OVERHEAD
        return _scaled(raw, self.scale)

    def elide(self, index: int, part: int | None) -> None:
        """Leaves out a tool result (`part` None) or one attachment of a message (its content's `part`)."""
        message = self.elided.get(index, self.body[index])
        if part is None:
            call_id = str(message.get("tool_call_id"))
            placeholder = dict(message, content=elision(_call_name(self.body, index), call_id, message))
            self.calls[index] = call_id
        else:
            file = self.files[index][part]
            content = list(message["content"])
            content[part] = {"type": "text", "text": file_elision(file)}
            placeholder = dict(message, content=content)
            self.file_ids.setdefault(index, []).append(str(file.get("file_id")))
        self.elided[index] = placeholder
        self.sizes[index] = _size(placeholder)

    def attachments(self, index: int) -> list[int]:
        """The parts of a message that are attachments still sent."""
        if index >= len(self.files) or not self.files[index]:
            return []
        content = self.elided.get(index, self.body[index]).get("content")
        if not isinstance(content, list):
            return []
        return [p for p in sorted(self.files[index]) if p < len(content) and content[p].get("type") != "text"]

    def messages(self, start: int, summary: Summary | None) -> list[dict[str, Any]]:
        system = _system(self.system, summary)
        head = [system] if system is not None else []
        return head + [self.elided.get(i, self.body[i]) for i in range(start, len(self.body))]

    def elided_ids(self, start: int) -> tuple[str, ...]:
        return tuple(self.calls[i] for i in sorted(self.calls) if i >= start)

    def elided_files(self, start: int) -> tuple[str, ...]:
        return tuple(f for i in sorted(self.file_ids) if i >= start for f in self.file_ids[i])


def blocks(body: Sequence[dict[str, Any]], turns: Sequence[tuple[str, ...]]) -> list[Block]:
    """The body's turns: a user message of another turn than the open block's starts a new block."""
    found: list[Block] = []
    start = 0
    ids: list[str] = []
    for index, message in enumerate(body):
        own = turns[index] if index < len(turns) else ()
        if message.get("role") == "user" and index > start and own and own[0] not in ids:
            found.append(Block(tuple(ids), start, index))
            start, ids = index, []
        ids.extend(t for t in own if t not in ids)
    if start < len(body):
        found.append(Block(tuple(ids), start, len(body)))
    return found


def plan(
    messages: Sequence[dict[str, Any]],
    turns: Sequence[tuple[str, ...]],
    *,
    budget: int | None,
    policy: Policy,
    summary: Summary | None = None,
    scale: float = 1.0,
    overhead: int = 0,
    may_fold: bool = True,
    files: Sequence[Mapping[int, Mapping[str, Any]]] = (),
) -> View:
    """The view to send. `turns` names each message's turns (aligned with `messages`; messages past its
    end belong to the running turn, whose id is not needed: it is always kept). `budget`: the window
    minus the reserve (None: unknown, everything is sent). With `may_fold` false, no new summary is asked
    for: whatever does not fit is elided, down to the last resort. `files` names each message's attached
    images and documents by their index in its content (turns.attachments; aligned as `turns` is)."""
    has_system = bool(messages) and messages[0].get("role") == "system"
    system = dict(messages[0]) if has_system else None
    body = list(messages[1:] if has_system else messages)
    body_turns = list(turns[1:] if has_system else turns)
    body_files = files[1:] if has_system else files
    prompt = _Prompt(system, body, [_size(m) for m in body], scale, overhead, body_files)
    if policy.strategy == "off" or budget is None:
        return View(list(messages), prompt.tokens(0, None), True)
    cut = blocks(body, body_turns)
    keep = max(1, policy.keep_turns)
    first, summary = _applied(cut, summary)
    start = cut[first].start if first < len(cut) else len(body)
    foldable = cut[first : len(cut) - keep] if len(cut) - keep > first else []
    kept = cut[max(first, len(cut) - keep) :]

    def fits() -> bool:
        return prompt.tokens(start, summary) <= budget

    if fits() or _elide_until(prompt, foldable, BULKY_TOKENS, fits):
        return _view(prompt, start, summary, budget)
    if _crowded(prompt, kept, budget):
        # The kept turns alone leave no room for the older ones: their bulky results go now, the running
        # turn's excepted, or every later turn would fold one more block (a model call per turn).
        _elide_until(prompt, kept[:-1], BULKY_TOKENS, lambda: not _crowded(prompt, kept, budget))
        if fits():
            return _view(prompt, start, summary, budget)
    if may_fold and foldable:
        return _fold(prompt, start, summary, foldable, budget)
    for threshold in (BULKY_TOKENS, LAST_RESORT_TOKENS):
        if _elide_until(prompt, kept, threshold, fits):
            break
    return _view(prompt, start, summary, budget)


def _elide_until(prompt: _Prompt, where: list[Block], threshold: int, done: Callable[[], bool]) -> bool:
    """Elides the results and attachments past `threshold` of `where`, oldest first, until `done`; whether
    it is."""
    for block in where:
        for index, part in _bulky(prompt, block, threshold):
            if done():
                return True
            prompt.elide(index, part)
    return done()


def _applied(cut: list[Block], summary: Summary | None) -> tuple[int, Summary | None]:
    """The first block after the summary, and the summary if it applies: one whose last turn is a block
    of this history other than the running turn's (also a block a harder plan folded inside the tail).
    Another path's summary, or one of a history that changed, does not."""
    if summary is None:
        return 0, None
    covered = next((i for i, b in enumerate(cut[:-1]) if b.key == summary.through_turn_id), None)
    return (0, None) if covered is None else (covered + 1, summary)


def _crowded(prompt: _Prompt, kept: list[Block], budget: int) -> bool:
    """The kept turns with a summary's room take more than the fold target."""
    tail = prompt.tokens(kept[0].start, None) if kept else 0
    return tail + int(budget * SUMMARY_SHARE) > int(budget * FOLD_TARGET)


def _fold(prompt: _Prompt, start: int, summary: Summary | None, foldable: list[Block], budget: int) -> View:
    """The oldest blocks to fold: down to FOLD_TARGET of the budget with a summary of SUMMARY_SHARE, or all
    of the foldable blocks."""
    room = int(budget * SUMMARY_SHARE)
    target = int(budget * FOLD_TARGET)
    rest = prompt.tokens(start, summary)
    fold: list[Block] = []
    for block in foldable:
        fold.append(block)
        rest -= _scaled(sum(prompt.sizes[block.start : block.end]), prompt.scale)
        if rest + room <= target:
            break
    return replace(_view(prompt, start, summary, budget), fits=False, fold=tuple(fold))


def _view(prompt: _Prompt, start: int, summary: Summary | None, budget: int) -> View:
    used = prompt.tokens(start, summary)
    return View(
        prompt.messages(start, summary),
        used,
        used <= budget,
        summary,
        prompt.elided_ids(start),
        prompt.elided_files(start),
    )


def _bulky(prompt: _Prompt, block: Block, threshold: int) -> list[tuple[int, int | None]]:
    """A block's tool results and attachments past `threshold`, in history order: (message, None) for a
    result, (message, part) for an attachment."""
    found: list[tuple[int, int | None]] = []
    for i in range(block.start, block.end):
        role = prompt.body[i].get("role")
        if role == "tool":
            if i not in prompt.calls and prompt.sizes[i] > threshold:
                found.append((i, None))
        elif role == "user" and i < len(prompt.files) and prompt.files[i]:
            content = prompt.elided.get(i, prompt.body[i])["content"]
            found.extend((i, p) for p in prompt.attachments(i) if tokens.part_tokens(content[p]) > threshold)
    return found


def _call_name(body: Sequence[dict[str, Any]], index: int) -> str:
    call_id = body[index].get("tool_call_id")
    for message in reversed(body[:index]):
        for call in message.get("tool_calls") or ():
            if call.get("id") == call_id:
                return str((call.get("function") or {}).get("name") or "tool")
    return "tool"


def elision(name: str, call_id: str, message: dict[str, Any]) -> str:
    """The placeholder of an elided tool result: what it was, and that the history still has it."""
    size = len(tokens.content_text(message.get("content")))
    return (
        f"[Parley elided this result of {name} (call {call_id}, {size} characters) to fit the context "
        "window; it is kept in the session's history.]"
    )


def file_elision(file: Mapping[str, Any]) -> str:
    """The placeholder of an elided attachment: which file it was, and that the history still has it."""
    return (
        f"[Parley elided the attached file {file.get('name')} ({file.get('media_type')}, file "
        f"{file.get('file_id')}) to fit the context window; it is kept in the session's history.]"
    )


def summary_text(summary: Summary) -> str:
    return f"{SUMMARY_HEADING}\n\n{summary.content}"


def _system(system: dict[str, Any] | None, summary: Summary | None) -> dict[str, Any] | None:
    """The system message, with the summary after the session's own prompt (a summary is no user or
    assistant message: strict providers want those to alternate, and the tail begins with a user's)."""
    if summary is None:
        return system
    if system is None:
        return {"role": "system", "content": summary_text(summary)}
    return dict(system, content=f"{tokens.content_text(system.get('content'))}\n\n{summary_text(summary)}")


def _size(message: dict[str, Any]) -> int:
    return tokens.prompt_tokens([message]) - tokens.PROMPT_OVERHEAD


def _scaled(raw: int, scale: float) -> int:
    return int(raw * scale + 0.999)
