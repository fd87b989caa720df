"""tether: pi coding agents on long-lived sessions, every follow-up faithful inside a fixed
context budget.

    from tether import open_ledger, load_config, build_view, execute_run, RunRequest

Data flows one way: request → follow-up view (``tether.followup``) → harness (``tether.harness``,
pi over RPC) → mirror (``tether.mirror``) → ledger (``tether.ledger``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from tether.harness.run import RunOutcome, RunRequest, execute_run
    from tether.ledger import Ledger, NewRow, RunStatus, open_ledger

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

# Where each public name lives. Importing ``tether`` (which every ``tether.*`` import does first)
# loads none of them: the CLI imports only what the command it runs needs.
_HOME = {
    **dict.fromkeys(["Config", "load_config"], "tether.config"),
    **dict.fromkeys(["FollowupView", "Refusal", "RefusalReason", "build_view"], "tether.followup"),
    **dict.fromkeys(["RunOutcome", "RunRequest", "execute_run"], "tether.harness.run"),
    **dict.fromkeys(["Ledger", "NewRow", "RunStatus", "open_ledger"], "tether.ledger"),
}


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module(_HOME.get(name, "tether.errors")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tether' has no attribute {name!r}")
