"""What the runner tells the fan-out about its turns: a Notifier, in-process or across replicas.

- `LocalNotifier` (one process): committed events go to this process's broker only, and nothing needs to
  know where a turn runs.
- With PARLEY_REDIS_URL the Redis relay is the notifier (streaming.redis.relay): a session whose turn runs
  here is left out of its reader (`running`), and taken in again once no turn of it runs here
  (`turn_over`).

The runner is handed one at construction and calls it; neither is set on the other afterwards.
"""

from __future__ import annotations

from typing import Protocol


class Notifier(Protocol):
    def running(self, session_id: str, here: bool) -> None:
        """A turn of the session runs here from now on (`here`), or no longer."""
        ...

    def turn_over(self, session_id: str) -> None:
        """The session's turn ended here and no next one started here."""
        ...


class LocalNotifier:
    """One process: its broker hears every event from the write-behind; nobody asks where turns run."""

    def running(self, session_id: str, here: bool) -> None:
        return None

    def turn_over(self, session_id: str) -> None:
        return None
