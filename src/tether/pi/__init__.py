"""Speaking to pi: nothing here knows about runs or the ledger (DESIGN §2, §5).

Bottom up: ``jsonl`` (framing on ``\\n`` only), ``protocol`` (pi's command, event and stop-reason
names, one for one), ``transport`` (the ``AgentTransport`` seam; pi as a child process),
``client`` (the async RPC client), ``install`` (finding the pinned pi and Node 22, pi's command
line and environment), ``agentdir`` and ``sessionfile`` (what a run's pi reads at start).
"""

from __future__ import annotations

from tether.pi.client import Closed, Record, RpcClient, Stray
from tether.pi.errors import PiNotInstalled, PiStartupFailed, ProtocolError, TransportClosed
from tether.pi.install import PiInstall, find_pi, pi_argv, pi_env
from tether.pi.protocol import Command, Event, PiStopReason, Response
from tether.pi.transport import AgentTransport, SubprocessTransport

__all__ = [
    "AgentTransport",
    "Closed",
    "Command",
    "Event",
    "PiInstall",
    "PiNotInstalled",
    "PiStartupFailed",
    "PiStopReason",
    "ProtocolError",
    "Record",
    "Response",
    "RpcClient",
    "Stray",
    "SubprocessTransport",
    "TransportClosed",
    "find_pi",
    "pi_argv",
    "pi_env",
]
