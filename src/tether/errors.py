"""The one error tree of tether.

    TetherError
    ├── ConfigError            bad or missing configuration (CLI exit 2)
    ├── LedgerError            the run ledger refused or failed an operation
    │   ├── NotFound           no such session, run or row
    │   ├── AlreadyExists      a session or run id that is taken
    │   ├── FencedOut          a stale fence: another owner claimed the run since
    │   ├── RunNotActive       the run is not running (finished, failed, queued …)
    │   ├── SessionRefusing    the session refuses new prompts until an operator clears it
    │   └── InterchangeError   a JSONL ledger file is malformed (names file, line, problem)
    ├── HarnessError           driving pi failed (startup, transport, protocol)
    ├── RecallError            a recall or note request is malformed or over its bound (exit 2)
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
    "RecallError",
    "RunNotActive",
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


class InterchangeError(LedgerError):
    """A ledger JSONL file is malformed. The message names the file, the line and the problem."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        super().__init__(f"{source}:{line}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


class HarnessError(TetherError):
    """Driving pi failed: it did not start, its transport broke, or it spoke out of protocol."""


class RecallError(TetherError):
    """A recall or note request is malformed (no words, a reversed range) or over its bound."""


class ModelError(TetherError):
    """The embedded model (``tether model …``) is not installed, did not start, or did not stop."""
