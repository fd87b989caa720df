"""The pi harness: one run of a pi agent on a session, over pi's RPC mode (DESIGN §2, §3.5, §5).

    from tether.harness import RunRequest, execute_run

    outcome = await execute_run(ledger, config, RunRequest(session="s1", agent="reviewer",
                                                           text="Review the diff"))
    outcome.status, outcome.answer

Layers, bottom up: ``jsonl`` (framing on ``\\n`` only), ``protocol`` (pi's command and event
names), ``transport`` (the ``AgentTransport`` seam; pi as a child process), ``client`` (the async
RPC client), ``events`` (tether's own run events), ``agentdir`` and ``sessionfile`` (what a run's
pi reads at start), ``stops`` and ``run`` (the lifecycle).
"""

from __future__ import annotations

from tether.harness.client import RpcClient
from tether.harness.errors import PiNotInstalled, PiStartupFailed, ProtocolError, TransportClosed
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

__all__ = [
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
    "execute_run",
    "find_pi",
]
