"""The one error tree of tether.

    TetherError
    ├── ConfigError            bad or missing configuration (CLI exit 2)
    ├── UsageError             a bad argument or request: an id, invalid UTF-8 (CLI exit 2)
    ├── LedgerError            the run ledger refused or failed an operation
    │   ├── NotFound           no such session, run or row
    │   ├── AlreadyExists      a session or run id that is taken
    │   ├── FencedOut          a stale fence: another owner claimed the run since
    │   ├── RunNotActive       the run is not running (finished, failed, queued …)
    │   ├── SessionRefusing    the session refuses new prompts until an operator clears it
    │   ├── SessionBusy        the session has a live run and the caller would not wait
    │   ├── InterchangeError   a JSONL ledger file is malformed (names file, line, problem;
    │   │                      CLI exit 2)
    │   ├── BadLedgerUrl       the ledger URL names no ledger tether can open (CLI exit 2)
    │   ├── InvalidId          an id (session, run, actor, agent) that is empty, not printable
    │   │                      or holds a newline (also a UsageError: CLI exit 2)
    │   └── StorageError       the database under the ledger failed (locked, full, read-only,
    │                          permission, connection lost, corrupt); names the ledger and what
    │                          to do
    ├── HarnessError           driving pi failed (startup, transport, protocol)
    ├── RecallError            a recall or note request is malformed or over its bound (exit 2)
    ├── ModelError             the embedded model server is missing, failed to start or to stop
    ├── WorkspaceError         a session's workspace could not be made, copied or removed
    └── Refused                a follow-up view was refused (tether.followup.Refused; carries
                               a RefusalReason)

Foreign errors (sqlite3, psycopg, OS, RPC) are translated once, at the ledger and harness edges,
with ``raise … from exc``.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "BadLedgerUrl",
    "ConfigError",
    "FencedOut",
    "HarnessError",
    "InterchangeError",
    "InvalidId",
    "LedgerError",
    "ModelError",
    "NotFound",
    "RecallError",
    "RunNotActive",
    "SessionBusy",
    "SessionRefusing",
    "StorageError",
    "TetherError",
    "UsageError",
    "WorkspaceError",
]


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class ConfigError(TetherError):
    """The configuration is missing, unreadable or invalid."""


class UsageError(TetherError):
    """A bad argument or request: the command was asked for something it cannot take."""


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
    wait (``tether run --no-wait``; docs/architecture.md#custody). Printed as
    ``{"status":"refused","reason":"session_busy"}``, exit 3."""

    reason = "session_busy"

    def __init__(self, session: str, live: str | None, message: str | None = None) -> None:
        self.session = session
        self.live = live
        """The run that holds the session (None when only queued runs are ahead)."""
        holder = f"run {live} is live on it" if live else "runs are queued on it"
        super().__init__(
            message
            or f"session {session!r} is busy: {holder}; wait for it (drop --no-wait) or try later"
        )


class InterchangeError(LedgerError):
    """A ledger JSONL file is malformed. The message names the file, the line and the problem."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        super().__init__(f"{source}:{line}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


class BadLedgerUrl(LedgerError):
    """The ledger URL names no ledger tether can open (a configuration error)."""


class InvalidId(LedgerError, UsageError):
    """An id (session, run, actor, agent) that is empty, not printable or holds a newline."""


class StorageError(LedgerError):
    """The database under the ledger failed: locked, full, read-only, a permission, a lost
    connection, a corrupt record. The message names the ledger and what to do."""


class HarnessError(TetherError):
    """Driving pi failed: it did not start, its transport broke, or it spoke out of protocol."""


class RecallError(TetherError):
    """A recall or note request is malformed (no words, a reversed range) or over its bound."""


class ModelError(TetherError):
    """The embedded model (``tether model …``) is not installed, did not start, or did not stop."""


class WorkspaceError(TetherError):
    """A session's workspace (:mod:`tether.pi.workspace`) could not be made, copied or removed:
    a copy or a git command failed, or the directory holds another session's workspace."""
