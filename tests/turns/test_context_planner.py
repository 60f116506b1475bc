"""app.turns.context.planner: every prompt it produces is a valid history (each tool result right after its
call, strict providers' rules) within its budget, the history it reads never changes, and the last turns
go verbatim. Random histories (hypothesis) and the cases that matter by name."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.llm import tokens
from app.storage.tables import ChatMessageRow
from app.turns.context.planner import (
    LAST_RESORT_TOKENS,
    Policy,
    Summary,
    View,
    blocks,
    plan,
)
from app.turns.prompt import rebuild
from tests.fakes.strict import validate_history

Message = dict[str, Any]
# A turn: the user's message, its tool rounds (each result's size), the answer, and a steer (or none).
Spec = tuple[str, list[list[int]], str, str | None]
_rows = itertools.count(1)


def _turn(turn_id: str, user: str, rounds: list[list[int]], answer: str, steer: str | None) -> list[Message]:
    """One turn's messages: the user's, tool rounds (results of the given sizes), a steer, the answer."""
    messages: list[Message] = [{"role": "user", "content": user}]
    for n, sizes in enumerate(rounds):
        calls = [
            {
                "id": f"{turn_id}_c{n}_{k}",
                "type": "function",
                "function": {"name": "fetch", "arguments": json.dumps({"n": k})},
            }
            for k in range(len(sizes))
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages.extend(
            {"role": "tool", "tool_call_id": call["id"], "content": "x" * size}
            for call, size in zip(calls, sizes, strict=True)
        )
    if steer is not None and rounds:
        messages.append({"role": "user", "content": steer})
    messages.append({"role": "assistant", "content": answer})
    return messages


_turns = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=300).filter(lambda s: s.strip() != ""),
        st.lists(st.lists(st.integers(0, 20_000), min_size=1, max_size=3), max_size=3),
        st.text(min_size=1, max_size=300).filter(lambda s: s.strip() != ""),
        st.none() | st.just("and also this, please"),
    ),
    min_size=1,
    max_size=14,
)


def _history(spec: list[Spec], system: bool) -> tuple[list[Message], list[tuple[str, ...]]]:
    messages: list[Message] = [{"role": "system", "content": "Be brief."}] if system else []
    owners: list[tuple[str, ...]] = [()] if system else []
    for n, (user, rounds, answer, steer) in enumerate(spec):
        turn = _turn(f"t_{n}", user, rounds, answer, steer)
        messages.extend(turn)
        owners.extend([(f"t_{n}",)] * len(turn))
    return messages, owners


def _check(view: View, history: list[Message], budget: int, scale: float, overhead: int) -> None:
    assert validate_history(view.messages) == [], view.messages
    raw = tokens.prompt_tokens(view.messages) + overhead
    assert view.tokens == int(raw * scale + 0.999)
    if view.fits:
        assert view.tokens <= budget
    # The last message of the history (the running turn's last) is always sent.
    assert view.messages[-1]["role"] == history[-1]["role"]
    # Elided results keep their call id and say so; the others are sent as they are.
    originals = {m.get("tool_call_id"): m for m in history if m["role"] == "tool"}
    for message in view.messages:
        if message["role"] != "tool":
            continue
        if message["tool_call_id"] in view.elided_tool_call_ids:
            assert message["content"].startswith("[Parley elided this result")
            assert message["tool_call_id"] in message["content"]
        else:
            assert message == originals[message["tool_call_id"]]


@settings(max_examples=300, deadline=None)
@given(
    spec=_turns,
    system=st.booleans(),
    budget=st.integers(300, 12_000),
    keep=st.integers(1, 5),
    scale=st.sampled_from([1.0, 1.15, 1.6]),
    overhead=st.integers(0, 200),
)
def test_every_view_is_valid_within_budget_and_leaves_the_history_alone(
    spec: list[Spec],
    system: bool,
    budget: int,
    keep: int,
    scale: float,
    overhead: int,
) -> None:
    history, owners = _history(spec, system)
    before = copy.deepcopy(history)
    policy = Policy("auto", keep, 0)
    summary: Summary | None = None
    for attempt in range(3):
        view = plan(
            history, owners, budget=budget, policy=policy, summary=summary, scale=scale, overhead=overhead
        )
        assert history == before
        _check(view, history, budget, scale, overhead)
        if not view.fold:
            break
        # The folded blocks are the oldest not yet summarised, never one of the last `keep`.
        cut = blocks(history[1:] if system else history, owners[1:] if system else owners)
        assert all(b in cut[: len(cut) - keep] for b in view.fold)
        covered = list(summary.turn_ids) if summary else []
        assert [t for b in view.fold for t in b.turn_ids][:1] != covered[-1:]
        summary = Summary(
            f"cs_{attempt}", "- a short summary", (*covered, *(t for b in view.fold for t in b.turn_ids))
        )
    final = plan(
        history,
        owners,
        budget=budget,
        policy=policy,
        summary=summary,
        scale=scale,
        overhead=overhead,
        may_fold=False,
    )
    _check(final, history, budget, scale, overhead)
    if not final.fits:
        # Only when even the kept turns' results are all elided is a prompt left over its budget.
        sizes = [
            tokens.prompt_tokens([m]) - tokens.PROMPT_OVERHEAD for m in final.messages if m["role"] == "tool"
        ]
        assert all(size <= LAST_RESORT_TOKENS + 30 for size in sizes)


@settings(max_examples=200, deadline=None)
@given(spec=_turns, keep=st.integers(1, 5))
def test_a_history_that_fits_is_sent_whole(spec: list[Spec], keep: int) -> None:
    history, owners = _history(spec, True)
    view = plan(history, owners, budget=10**9, policy=Policy("auto", keep, 0))
    assert view.messages == history
    assert (view.fits, view.fold, view.elided_tool_call_ids, view.summary) == (True, (), (), None)


def test_off_sends_the_whole_history_whatever_its_size() -> None:
    history, owners = _history([("hi", [[50_000]], "done", None)] * 3, False)
    view = plan(history, owners, budget=100, policy=Policy("off", 1, 0))
    assert view.messages == history
    assert view.fits  # `off` never compacts: the provider is the judge


def test_old_bulky_results_go_first_and_keep_their_call_id() -> None:
    history, owners = _history(
        [("look", [[8000, 100]], "found", None), ("more", [], "ok", None), ("again", [], "sure", None)], False
    )
    view = plan(history, owners, budget=1500, policy=Policy("auto", 2, 0))
    assert view.elided_tool_call_ids == ("t_0_c0_0",)
    assert view.fold == () and view.fits
    assert view.summary is None


def test_a_fold_takes_whole_turns_and_the_summary_replaces_them_in_the_system_message() -> None:
    spec: list[Spec] = [(f"question {n} " + "word " * 300, [], "answer " * 200, None) for n in range(8)]
    history, owners = _history(spec, True)
    view = plan(history, owners, budget=2500, policy=Policy("auto", 2, 0))
    assert view.fold and view.fold[0].turn_ids == ("t_0",)
    turns = tuple(t for b in view.fold for t in b.turn_ids)
    summary = Summary("cs_1", "The user asked eight questions.", turns)
    view = plan(history, owners, budget=2500, policy=Policy("auto", 2, 0), summary=summary)
    assert view.fits and view.fold == ()
    assert view.messages[0]["role"] == "system"
    assert view.messages[0]["content"].startswith("Be brief.")
    assert "The user asked eight questions." in view.messages[0]["content"]
    assert view.messages[1] == {"role": "user", "content": spec[len(turns)][0]}
    assert view.summarized_turn_ids == turns


def test_a_summary_of_another_path_never_applies() -> None:
    history, owners = _history([("a", [], "b", None)] * 4, False)
    other = Summary("cs_9", "elsewhere", ("t_other",))
    view = plan(history, owners, budget=10**6, policy=Policy("auto", 1, 0), summary=other)
    assert view.summary is None and view.messages == history


def test_a_steer_stays_in_its_turns_block_and_a_merged_message_names_both_turns() -> None:
    history, owners = _history([("a", [[10]], "b", "steer"), ("c", [], "d", None)], False)
    cut = blocks(history, owners)
    assert [b.turn_ids for b in cut] == [("t_0",), ("t_1",)]
    # A failed turn's user message merged with the next turn's: one block naming both.
    rows = [_row("t_1", "user", "first"), _row("t_2", "user", "second"), _row("t_2", "assistant", "hi")]
    found: list[tuple[str, ...]] = []
    messages = rebuild(rows, None, found)
    assert found == [("t_1", "t_2"), ("t_2",)]
    assert [b.turn_ids for b in blocks(messages, found)] == [("t_1", "t_2")]


def test_a_running_turn_too_big_for_the_window_has_its_results_elided_last_resort() -> None:
    history, owners = _history([("read it all", [[40_000, 40_000]], "done", None)], False)
    history.pop()  # the running turn: its answer is not written yet
    view = plan(history, owners, budget=500, policy=Policy("auto", 3, 0), may_fold=False)
    assert view.fits
    assert set(view.elided_tool_call_ids) == {"t_0_c0_0", "t_0_c0_1"}
    assert validate_history(view.messages) == []


PHOTO = {"file_id": "file_photo", "name": "beach.png", "media_type": "image/png", "size": 9000}
DATA = "data:image/png;base64," + "iVBORw0KGgo" * 800


def _with_photo(turns: int) -> tuple[list[Message], list[tuple[str, ...]], list[dict[int, Any]]]:
    """A history whose first user message has a photo (as turns.attachments sends it: a label, then the
    image part), and the file of that part named as with_files names it."""
    spec: list[Spec] = [(f"question {n} " + "word " * 100, [], "answer " * 60, None) for n in range(turns)]
    history, owners = _history(spec, False)
    label = {"type": "text", "text": "[Attached file: beach.png (image/png, 9000 bytes)]"}
    history[0] = {
        "role": "user",
        "content": [
            {"type": "text", "text": spec[0][0]},
            label,
            {"type": "image_url", "image_url": {"url": DATA}},
        ],
    }
    files: list[dict[int, Any]] = [{} for _ in history]
    files[0] = {2: PHOTO}
    return history, owners, files


def test_an_old_image_goes_first_as_a_placeholder_naming_the_file() -> None:
    history, owners, files = _with_photo(4)
    before = copy.deepcopy(history)
    whole = plan(history, owners, budget=10**6, policy=Policy("auto", 2, 0), files=files)
    assert whole.messages == history and whole.elided_file_ids == ()
    # The image alone is what does not fit: it goes, and nothing else does.
    budget = whole.tokens - tokens.ATTACHMENT_TOKENS + 50
    view = plan(history, owners, budget=budget, policy=Policy("auto", 2, 0), files=files)
    assert history == before
    assert view.fits and view.fold == () and view.summary is None
    assert (view.elided_file_ids, view.elided_tool_call_ids) == (("file_photo",), ())
    first = view.messages[0]["content"]
    assert [part["type"] for part in first] == ["text", "text", "text"]
    placeholder = first[2]["text"]
    assert placeholder.startswith("[Parley elided the attached file beach.png")
    assert "image/png" in placeholder and "file_photo" in placeholder
    assert DATA not in json.dumps(view.messages)
    assert view.messages[1:] == history[1:]
    assert validate_history(view.messages) == []


@settings(max_examples=200, deadline=None)
@given(spec=_turns, budget=st.integers(300, 12_000), keep=st.integers(1, 5), photos=st.integers(1, 3))
def test_views_of_a_history_with_images_are_valid_and_name_every_image_they_leave_out(
    spec: list[Spec], budget: int, keep: int, photos: int
) -> None:
    history, owners = _history(spec, True)
    files: list[dict[int, Any]] = [{} for _ in history]
    users = [i for i, m in enumerate(history) if m["role"] == "user"]
    for n, index in enumerate(users[::photos]):
        parts: list[Message] = [{"type": "text", "text": history[index]["content"]}]
        parts += [{"type": "text", "text": "[Attached file: p.png]"}, {"type": "image_url", "image_url": {}}]
        history[index] = {"role": "user", "content": parts}
        files[index] = {2: {"file_id": f"f_{n}", "name": "p.png", "media_type": "image/png"}}
    before = copy.deepcopy(history)
    view = plan(history, owners, budget=budget, policy=Policy("auto", keep, 0), may_fold=False, files=files)
    assert history == before
    _check(view, history, budget, 1.0, 0)
    sent = json.dumps(view.messages)
    for file_id in (f["file_id"] for named in files for f in named.values()):
        assert (f"file {file_id})" in sent) == (file_id in view.elided_file_ids)
    assert sent.count('"type": "image_url"') == sum(map(len, files)) - len(view.elided_file_ids)


def test_the_running_turns_image_is_sent_and_older_turns_fold_instead() -> None:
    history, owners, files = _with_photo(6)
    # The photo moves to the running turn (the last, its answer not written yet).
    history[0], history[-2] = history[-2], history[0]
    files[0], files[-2] = files[-2], files[0]
    history.pop()
    files.pop()
    whole = plan(history, owners, budget=10**6, policy=Policy("auto", 2, 0), files=files)
    view = plan(history, owners, budget=whole.tokens - 300, policy=Policy("auto", 2, 0), files=files)
    assert view.fold and view.elided_file_ids == ()
    assert DATA in json.dumps(view.messages)


def _row(turn: str, role: str, content: str) -> ChatMessageRow:
    n = next(_rows)
    return ChatMessageRow(
        position=n,
        id=f"m_{n:012x}",
        session_id="s_1",
        turn_id=turn,
        type="text",
        role=role,
        content=content,
        response_id=f"r_{n}" if role == "assistant" else None,
        timestamp="2026-11-29T04:00:00.000+00:00",
    )
