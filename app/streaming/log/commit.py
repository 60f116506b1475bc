"""A commit whose outcome is known even when the task awaiting it is cancelled meanwhile (the
write-behind's batches and a turn's writes), in a task of its own (`settled`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from sqlmodel.ext.asyncio.session import AsyncSession

from app.observability.hooks import commit_observed

T = TypeVar("T")

# The write-behind's commits are made in tasks of these names (observability.monitor counts them apart):
# an interval batch, or an urgent one (whichever task starts it: see group_commit.opened).
BATCH_TASK = "write-behind"
URGENT_TASK = "write-behind:urgent"
_TASK_OF_KIND = {"batch": BATCH_TASK, "urgent": URGENT_TASK}


async def commit(db: AsyncSession, kind: str) -> None:
    """Commits, and knows whether it did even when the caller is cancelled meanwhile (`settled`)."""
    await settled(db.commit(), kind)


async def settled(work: Coroutine[Any, Any, T], kind: str) -> T:
    """Runs `work` (a commit, or a write that ends with its commit) to its end, and knows its outcome
    even when the caller is cancelled meanwhile.

    The driver's thread finishes a commit that has begun whatever happens to the task awaiting it, so a
    cancellation here is held back until the outcome is known: a failed commit raises as usual, a
    successful one returns, so its numbers and events are accounted for as committed, and the
    cancellation is delivered again at the caller's next await. Without this, a batch that did commit
    could be logged a second time.
    """
    caller = asyncio.current_task()
    # Named after its kind of batch, or else its caller: the commit is that work (observability.monitor).
    name = _TASK_OF_KIND.get(kind) or (caller.get_name() if caller else None)
    task = asyncio.get_running_loop().create_task(work, name=name)
    started = time.monotonic()
    task.add_done_callback(lambda _: commit_observed(kind, time.monotonic() - started))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            raise
        if caller is not None:
            caller.uncancel()
            caller.cancel()
        return task.result()
