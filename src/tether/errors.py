"""The one error tree of tether.

    TetherError
    ├── ConfigError            bad or missing configuration (CLI exit 2)
    ├── LedgerError            the run ledger refused or failed an operation
    │   ├── NotFound           no such session, run or row
    │   ├── AlreadyExists      a session or run id that is taken
    │   ├── FencedOut          a stale fence: another owner claimed the run since
    │   ├── RunNotActive       the run is not running (finished, failed, queued …)
    │   ├── SessionRefusing    the session refuses new prompts until an operator clears it
    │   ├── SessionBusy        the session has a live run and the caller would not wait
    │   └── InterchangeError   a JSONL ledger file is malformed (names file, line, problem)
    ├── HarnessError           driving pi failed (startup, transport, protocol)
    ├── ModelError             the embedded model server is missing, failed to start or to stop
    └── Refused                a follow-up view was refused (tether.followup.Refused; carries
                               a RefusalReason)

Foreign errors (sqlite3, psycopg, OS, RPC) are translated once, at the ledger and harness edges,
with ``raise … from exc``.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "ConfigError",
    "FencedOut",
    "HarnessError",
    "InterchangeError",
    "LedgerError",
    "ModelError",
    "NotFound",
    "RunNotActive",
    "SessionBusy",
    "SessionRefusing",
    "TetherError",
]


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class ConfigError(TetherError):
    """The configuration is missing, unreadable or invalid."""


class LedgerError(TetherError):
    """The run ledger refused or failed an operation."""


class NotFound(LedgerError):
    """No such session, run or row."""


class AlreadyExists(LedgerError):
    """The id is taken."""


class FencedOut(LedgerError):
    """The write carried a stale fence: another owner has claimed the run since."""


class RunNotActive(LedgerError):
    """The run is not in the running state, so it takes no step writes."""


class SessionRefusing(LedgerError):
    """The session refuses new prompts until an operator clears it (``tether session clear``)."""


class SessionBusy(LedgerError):
    """The session has a live run (or runs queued before this one) and the caller asked not to
    wait (``tether run --no-wait``; DESIGN §3.7). Printed as
    ``{"status":"refused","reason":"session_busy"}``, exit 3."""

    reason = "session_busy"

    def __init__(self, session: str, live: str | None) -> None:
        self.session = session
        self.live = live
        """The run that holds the session (None when only queued runs are ahead)."""
        holder = f"run {live} is live on it" if live else "runs are queued on it"
        super().__init__(
            f"session {session!r} is busy: {holder}; wait for it (drop --no-wait) or try later"
        )


class InterchangeError(LedgerError):
    """A ledger JSONL file is malformed. The message names the file, the line and the problem."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        super().__init__(f"{source}:{line}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


class HarnessError(TetherError):
    """Driving pi failed: it did not start, its transport broke, or it spoke out of protocol."""


class ModelError(TetherError):
    """The embedded model (``tether model …``) is not installed, did not start, or did not stop."""
