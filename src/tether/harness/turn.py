"""What a run is asked to do and what it comes to: the request, the checkpoint step's contract
(``SettledTurn`` in, ``CheckpointResult`` out) and the outcome."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.clock import Clock
from tether.config import AgentConfig, Config
from tether.harness.client import RpcClient
from tether.harness.events import EventBus
from tether.harness.stops import StopControl, StopReason
from tether.ledger import Fence, Ledger, RunStatus
from tether.mirror.mirror import Mirror

__all__ = [
    "NOT_NEEDED",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
]


@dataclass(frozen=True, slots=True)
class RunRequest:
    session: str
    agent: str
    text: str
    actor: str = "user:local"
    workdir: Path | None = None
    """Where pi (and its tools) run; default: the current directory."""
    run_id: str | None = None
    extensions: tuple[Path, ...] = ()
    """pi extensions loaded with ``--extension`` (e.g. the continuation extension)."""


class CheckpointStatus(enum.StrEnum):
    NOT_NEEDED = "not_needed"
    WRITTEN = "written"


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    status: str
    """``written``, ``refused:<reason>`` or ``not_needed`` (DESIGN §3.5)."""
    refuse_session: str | None = None
    """When set, the session refuses further prompts with this reason (pi's idle was not
    confirmed, or the checkpoint's delivery is unknown)."""


NOT_NEEDED = CheckpointResult(CheckpointStatus.NOT_NEEDED.value)


@dataclass
class SettledTurn:
    """What the checkpoint step gets, after ``agent_settled`` of a successful task turn and
    before the run ends. The client still reads events (the mirror keeps mirroring), ``stop``
    still works (a soft stop or the deadline sends ``abort``, which also aborts a running
    compaction; a hard stop kills pi), and the step should give up by ``deadline``."""

    client: RpcClient
    ledger: Ledger
    fence: Fence
    mirror: Mirror
    config: Config
    agent_name: str
    agent: AgentConfig
    run_id: str
    session: str
    answer: str | None
    clock: Clock
    deadline: float
    """On ``clock``."""
    stop: StopControl
    bus: EventBus
    attempt: CheckpointResult | None = None
    """What the checkpoint counts as if the step is cut off (a hard stop cancels it); the step
    sets it once it has sent ``compact``."""

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock.now())


CheckpointStep = Callable[[SettledTurn], Awaitable[CheckpointResult]]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run: str
    session: str
    status: RunStatus
    stop_reason: StopReason
    answer: str | None
    checkpoint: str
    error: str | None
    run_dir: Path
    follow_up: bool

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run,
            "session": self.session,
            "status": self.status.value,
            "answer": self.answer,
            "checkpoint": self.checkpoint,
            "stop_reason": self.stop_reason.value,
        }
        if self.error:
            out["error"] = self.error
        return out
