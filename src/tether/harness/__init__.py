"""One run's lifecycle (docs/architecture.md, docs/cli.md#tether-run): the request, the follow-up
view, pi's task turn inside
its stop scopes, the checkpoint step, and one outcome value.

    from tether.harness import RunRequest, execute_run

    outcome = await execute_run(ledger, config, RunRequest(session="s1", agent="reviewer",
                                                           text="Review the diff"))
    outcome.status, outcome.answer, outcome.checkpoint.label

Speaking to pi lives in :mod:`tether.pi`; tether's own run events in :mod:`tether.events`.
Modules: ``stops`` (why and how a run stops: scopes, not flags), ``turn`` (the values a run
passes around and the verdict), ``pump`` (following pi's events), ``run`` (the driver),
``checkpoint`` (the continuation checkpoint step; pass ``checkpoint=continuation_checkpoint``
and ``RunRequest(extensions=(EXTENSION_PATH,))``).
"""

from __future__ import annotations

from tether.errors import SessionBusy
from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint
from tether.harness.run import execute_run, run_claimed
from tether.harness.rundir import runs_dir
from tether.harness.stops import StopControl, Stopped, StopReason
from tether.harness.turn import (
    NOT_NEEDED,
    CheckpointResult,
    CheckpointStatus,
    CheckpointStep,
    RunOutcome,
    RunRequest,
    SettledTurn,
)

__all__ = [
    "EXTENSION_PATH",
    "NOT_NEEDED",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "RunOutcome",
    "RunRequest",
    "SessionBusy",
    "SettledTurn",
    "StopControl",
    "StopReason",
    "Stopped",
    "continuation_checkpoint",
    "execute_run",
    "run_claimed",
    "runs_dir",
]
