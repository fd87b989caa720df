"""tether: pi coding agents on long-lived sessions, every follow-up faithful inside a fixed
context budget.

    from tether import open_ledger, load_config, build_view, execute_run, RunRequest

Data flows one way: request → follow-up view (``tether.followup``) → harness (``tether.harness``,
pi over RPC) → mirror (``tether.mirror``) → ledger (``tether.ledger``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether.config import Config, load_config
from tether.errors import (
    AlreadyExists,
    ConfigError,
    FencedOut,
    HarnessError,
    InterchangeError,
    LedgerError,
    NotFound,
    RunNotActive,
    SessionRefusing,
    TetherError,
)
from tether.followup import FollowupView, Refusal, RefusalReason, build_view
from tether.ledger import Ledger, NewRow, RunStatus, open_ledger

if TYPE_CHECKING:
    from tether.harness.run import RunOutcome, RunRequest, execute_run

__all__ = [
    "AlreadyExists",
    "Config",
    "ConfigError",
    "FencedOut",
    "FollowupView",
    "HarnessError",
    "InterchangeError",
    "Ledger",
    "LedgerError",
    "NewRow",
    "NotFound",
    "Refusal",
    "RefusalReason",
    "RunNotActive",
    "RunOutcome",
    "RunRequest",
    "RunStatus",
    "SessionRefusing",
    "TetherError",
    "build_view",
    "execute_run",
    "load_config",
    "open_ledger",
]

_HARNESS = {"RunOutcome", "RunRequest", "execute_run"}


def __getattr__(name: str) -> Any:
    # The harness pulls in anyio and the subprocess machinery; import it only when asked for.
    if name in _HARNESS:
        from tether.harness import run

        return getattr(run, name)
    raise AttributeError(f"module 'tether' has no attribute {name!r}")
