"""The entries the relay (redis_fanout) writes to Redis and reads back, and the notices it sends.

A session's stream holds its frames: each run of consecutive seqs is one entry (`pack`), whose id is the
run's last seq, so a run published twice is refused and a reader starting after any seq gets every run
that ends after it. Types and data are joined by newlines, which compact JSON never holds. A run that
starts or ends a turn also carries each frame's `turn` (frames.Frame), joined the same way, so that a
replica learns a turn's end from a field, not from the JSON.

A notice names the sessions a replica logged frames for without running their turn (a message posted
there, a queue edit, a cancel): a replica whose turn of such a session runs does not read that session's
stream (its own frames reach its streams directly), and reads it once on the notice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from app.streaming.frames import Frame
from app.streaming.redis.publish import Command, xadd

STREAM_MAXLEN = 2000
# Seconds a session's stream outlives its last event: idle sessions leave nothing behind.
STREAM_TTL = 3600
# A stream's expiry is set again at most this often (seconds) while its session publishes.
EXPIRE_EVERY = 60.0
# A notice stream keeps about this many entries: a reader that was away longer polls the log anyway.
NOTICE_MAXLEN = 1000

# Whether a turn of this session runs on this replica (the relay's `runs_here`, told by the runner).
RunsHere = Callable[[str], bool]


def publish_commands(
    batch: Sequence[tuple[str, Frame]],
    key: Callable[[str], str],
    expired: dict[str, float],
    notice_key: str,
    runs_here: RunsHere | None,
) -> list[Command]:
    """The commands that publish a batch of committed frames: each session's entries, its stream's
    expiry when `expired` (when each was last set, updated here) says it is due, and with `runs_here`,
    after all of them on the same connection, one notice naming the sessions whose turn does not run
    here (a reader that reads the notice finds their entries)."""
    by_session: dict[str, list[Frame]] = {}
    for session_id, frame in batch:
        by_session.setdefault(session_id, []).append(frame)
    commands: list[Command] = []
    now = time.monotonic()
    for session_id, frames in by_session.items():
        stream = key(session_id)
        commands.extend(xadd(stream, seq, fields, STREAM_MAXLEN) for seq, fields in pack(frames))
        if now - expired.get(stream, -EXPIRE_EVERY) >= EXPIRE_EVERY:
            commands.append(("EXPIRE", stream, STREAM_TTL))
            expired[stream] = now
    if runs_here is not None:
        foreign = [sid for sid in by_session if not runs_here(sid)]
        if foreign:
            commands.append(notice(notice_key, foreign))
    if len(expired) > 2 * len(by_session) + 10_000:
        for stream in [k for k, at in expired.items() if now - at >= EXPIRE_EVERY]:
            del expired[stream]
    return commands


def pack(frames: Sequence[Frame]) -> Iterator[tuple[int, dict[str, str]]]:
    """A session's frames, in order, as stream entries: (the id's seq, the fields) for each run of
    consecutive seqs. A frame whose data holds a newline (never compact JSON) is an entry of its own,
    whose data `unpack` does not split."""
    run: list[Frame] = []
    for frame in frames:
        alone = "\n" in frame.data
        if run and (alone or frame.seq != run[-1].seq + 1):
            yield _entry(run)
            run = []
        run.append(frame)
        if alone:
            yield _entry(run)
            run = []
    if run:
        yield _entry(run)


def _entry(run: list[Frame]) -> tuple[int, dict[str, str]]:
    if len(run) == 1:
        frame = run[0]
        fields = {"t": frame.type, "d": frame.data}
        if frame.turn is not None:
            fields["u"] = frame.turn
        return frame.seq, fields
    fields = {"t": "\n".join([f.type for f in run]), "d": "\n".join([f.data for f in run])}
    if any(f.turn is not None for f in run):  # a turn's edge: rare, text deltas carry none
        fields["u"] = "\n".join([f.turn or "" for f in run])
    return run[-1].seq, fields


def unpack(entry_id: str, fields: dict[str, str]) -> list[Frame]:
    """The frames of one entry `pack` made."""
    last = int(entry_id.partition("-")[0])
    types = fields["t"].split("\n")
    turns = fields.get("u")
    if len(types) == 1:
        return [Frame(last, types[0], fields["d"], turns or None)]
    first = last - len(types) + 1
    datas = fields["d"].split("\n")
    if turns is None:
        return [Frame(first + i, t, d) for i, (t, d) in enumerate(zip(types, datas, strict=True))]
    each = turns.split("\n")
    return [
        Frame(first + i, t, d, u or None) for i, (t, d, u) in enumerate(zip(types, datas, each, strict=True))
    ]


def unpack_all(entries: Sequence[tuple[str, dict[str, str]]]) -> list[Frame]:
    """The frames of a stream's entries, in order (an XREAD's or an XRANGE's reply for one stream)."""
    return [frame for id_, fields in entries for frame in unpack(id_, fields)]


def notice(key: str, session_ids: Sequence[str]) -> Command:
    """The XADD of a notice naming `session_ids`."""
    return ("XADD", key, "MAXLEN", "~", NOTICE_MAXLEN, "*", "s", "\n".join(session_ids))


def noticed(entries: Sequence[tuple[str, dict[str, str]]]) -> set[str]:
    """The sessions the notice entries name."""
    return {sid for _, fields in entries for sid in fields["s"].split("\n")}
