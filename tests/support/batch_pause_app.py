"""The app of tests.support.slow_app, made to freeze itself (SIGSTOP) in the middle of a write-behind
batch, right after the batch's fence check locked the rows of its turns' leases and before it commits:
a replica paused (a GC stall, a frozen VM) while it holds those locks, at a moment the test chooses
instead of one it hopes to hit.

    PAUSE_IN_BATCH_FILE=<path> python -m uvicorn tests.support.batch_pause_app:app

The test writes the session ids, one a line, to that file: the first batch whose check found all of
them alive here removes the file and stops the process. Nothing else changes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path

from sqlmodel.ext.asyncio.session import AsyncSession

from app.streaming.log.fencing import Fence
from tests.support.slow_app import app

__all__ = ["app"]

_screen = Fence.screen
_trigger = Path(os.environ["PAUSE_IN_BATCH_FILE"]) if "PAUSE_IN_BATCH_FILE" in os.environ else None


async def _screen_then_pause(self: Fence, db: AsyncSession, session_ids: Iterable[str]) -> set[str]:
    sessions = set(session_ids)
    dropped = await _screen(self, db, sessions)
    if _trigger is None or not _trigger.exists():
        return dropped
    wanted = set(_trigger.read_text().split())
    held = {sid for sid in sessions - dropped if (lease := self.lease(sid)) is not None and not lease.lost}
    if wanted and wanted <= held:
        try:
            _trigger.unlink()  # once only
        except FileNotFoundError:
            return dropped
        os.kill(os.getpid(), signal.SIGSTOP)  # here: the transaction open, the leases' rows locked
    return dropped


Fence.screen = _screen_then_pause  # type: ignore[method-assign]
