"""The pi harness: one run of a pi agent on a session, over pi's RPC mode (DESIGN §2, §3.5, §5).

    from tether.harness import RunRequest, execute_run

    outcome = await execute_run(ledger, config, RunRequest(session="s1", agent="reviewer",
                                                           text="Review the diff"))
    outcome.status, outcome.answer

Layers, bottom up: ``jsonl`` (framing on ``\\n`` only), ``protocol`` (pi's command and event
names), ``transport`` (the ``AgentTransport`` seam; pi as a child process), ``client`` (the async
RPC client), ``events`` (tether's own run events), ``agentdir`` and ``sessionfile`` (what a run's
pi reads at start), ``stops`` and ``run`` (the lifecycle), ``checkpoint`` (the continuation
checkpoint step, with the pi extension it needs: pass ``checkpoint=continuation_checkpoint`` and
``RunRequest(extensions=(EXTENSION_PATH,))``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint
    from tether.harness.client import RpcClient
    from tether.harness.errors import (
        PiNotInstalled,
        PiStartupFailed,
        ProtocolError,
        TransportClosed,
    )
    from tether.harness.pi import PiInstall, find_pi
    from tether.harness.run import (
        CheckpointResult,
        CheckpointStep,
        RunOutcome,
        RunRequest,
        SettledTurn,
        execute_run,
    )
    from tether.harness.stops import StopControl, StopReason
    from tether.harness.transport import AgentTransport, SubprocessTransport

# Names load on first use: the mirror imports ``tether.harness.events`` and the run imports the
# mirror, so importing the whole harness here would make that a cycle.
_WHERE = {
    "EXTENSION_PATH": "checkpoint",
    "continuation_checkpoint": "checkpoint",
    "RpcClient": "client",
    "PiNotInstalled": "errors",
    "PiStartupFailed": "errors",
    "ProtocolError": "errors",
    "TransportClosed": "errors",
    "PiInstall": "pi",
    "find_pi": "pi",
    "CheckpointResult": "run",
    "CheckpointStep": "run",
    "RunOutcome": "run",
    "RunRequest": "run",
    "SettledTurn": "run",
    "execute_run": "run",
    "StopControl": "stops",
    "StopReason": "stops",
    "AgentTransport": "transport",
    "SubprocessTransport": "transport",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'tether.harness' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tether.harness.{_WHERE[name]}"), name)


__all__ = [
    "EXTENSION_PATH",
    "AgentTransport",
    "CheckpointResult",
    "CheckpointStep",
    "PiInstall",
    "PiNotInstalled",
    "PiStartupFailed",
    "ProtocolError",
    "RpcClient",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
    "StopControl",
    "StopReason",
    "SubprocessTransport",
    "TransportClosed",
    "continuation_checkpoint",
    "execute_run",
    "find_pi",
]
