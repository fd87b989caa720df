"""What a run is asked to do and what it comes to, as values: the request, the checkpoint step's
contract (``SettledTurn`` in, ``CheckpointResult`` out), what the task turn ended with
(``TaskEnd``), the verdict drawn from those values, and the outcome."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from tether.clock import Clock
from tether.config import AgentConfig, Config
from tether.events import EventBus
from tether.harness.stops import StopControl, Stopped, StopReason
from tether.ledger import Fence, Ledger, ReceiptReason, RunStatus
from tether.mirror.mirror import Mirror
from tether.pi.client import RpcClient
from tether.pi.protocol import PiStopReason

__all__ = [
    "NOT_NEEDED",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "PiFailed",
    "PiSettled",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
    "TaskEnd",
    "Verdict",
    "verdict",
]


class RunRequest(msgspec.Struct, frozen=True):
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
    REFUSED = "refused"


class CheckpointResult(msgspec.Struct, frozen=True):
    status: CheckpointStatus
    reason: ReceiptReason | None = None
    """Why it was refused (the receipt's reason); None unless ``REFUSED``."""
    refuse_session: str | None = None
    """When set, the session refuses further prompts with this reason (pi's idle was not
    confirmed, or the checkpoint's delivery is unknown)."""

    @classmethod
    def refused(cls, reason: ReceiptReason, refuse_session: str | None = None) -> CheckpointResult:
        return cls(CheckpointStatus.REFUSED, reason, refuse_session)

    @property
    def label(self) -> str:
        """``written``, ``refused:<reason>`` or ``not_needed`` (DESIGN §3.5)."""
        if self.status is CheckpointStatus.REFUSED:
            return f"refused:{(self.reason or ReceiptReason.CANCELLED).value}"
        return self.status.value

    def __str__(self) -> str:
        return self.label


NOT_NEEDED = CheckpointResult(CheckpointStatus.NOT_NEEDED)


class SettledTurn(msgspec.Struct):
    """What the checkpoint step gets, after ``agent_settled`` of a successful task turn and
    before the run ends. The client still reads events (the mirror keeps mirroring), ``stop``
    still works (a soft stop or the deadline sends ``abort``, which also aborts a running
    compaction; a hard stop kills pi and cancels the step), and the step should give up by
    ``deadline``."""

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
    abort_answered: anyio.Event = msgspec.field(default_factory=anyio.Event)
    """Set when pi answered the ``abort`` a soft stop or the deadline sent: pi is idle, so the
    wait for the ``compact`` answer may end (DESIGN §3.6: the compaction's answer or a
    correlated abort answer)."""

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock.now())


CheckpointStep = Callable[[SettledTurn], Awaitable[CheckpointResult]]


# -- what the task turn ended with --------------------------------------------------------------


class PiSettled(msgspec.Struct, frozen=True):
    """pi settled (``agent_settled``) on its own."""

    aborted: bool
    last: dict[str, Any] | None
    """The last assistant message of the turn."""

    @property
    def stop_reason(self) -> PiStopReason | None:
        return PiStopReason.of(self.last)

    @property
    def succeeded(self) -> bool:
        return not self.aborted and self.stop_reason not in (
            PiStopReason.ERROR,
            PiStopReason.ABORTED,
        )


class PiFailed(msgspec.Struct, frozen=True):
    """pi never took the prompt, or went away before it settled."""

    reason: StopReason
    """``STARTUP_FAILED``, ``PROTOCOL_ERROR`` or ``TRANSPORT_LOST``."""
    message: str


TaskEnd = PiSettled | PiFailed | Stopped
"""What the task turn came to: an abort (a stop) is a value that ends the turn, like pi's own."""


class Verdict(msgspec.Struct, frozen=True):
    status: RunStatus
    stop_reason: StopReason
    error: str | None


def verdict(
    task: TaskEnd, *, late: Stopped | None, failure: Stopped | None, grace_s: float
) -> Verdict:
    """The run's status from what happened, in order of precedence:

    - ``failure``: the harness itself failed (a fenced-out write, a protocol breach);
    - the task turn: pi failed, or a stop ended the turn (interrupted);
    - ``late``: a stop that landed during the checkpoint, after a successful task turn: a soft
      one only cut the checkpoint short (finished), a hard one killed pi (interrupted). A stop
      after that changes nothing;
    - how pi settled: a provider error fails the run, an abort interrupts it.
    """
    for stop in (failure, task, late):
        if isinstance(stop, Stopped) and stop.is_failure:
            return Verdict(RunStatus.FAILED, stop.reason, stop.detail)
    if isinstance(task, PiFailed):
        return Verdict(RunStatus.FAILED, task.reason, task.message)
    if isinstance(task, Stopped):
        detail = task.detail
        if task.escalated:
            detail = f"pi did not settle within {grace_s:g}s of abort; it was killed"
        return Verdict(RunStatus.INTERRUPTED, task.reason, detail)
    if late is not None:
        status = RunStatus.INTERRUPTED if late.hard else RunStatus.FINISHED
        return Verdict(status, late.reason, None)
    if task.stop_reason is PiStopReason.ERROR:
        message = (task.last or {}).get("errorMessage")
        return Verdict(RunStatus.FAILED, StopReason.SETTLED, f"the provider failed: {message}")
    if task.aborted or task.stop_reason is PiStopReason.ABORTED:
        return Verdict(RunStatus.INTERRUPTED, StopReason.SETTLED, "pi aborted the run")
    return Verdict(RunStatus.FINISHED, StopReason.SETTLED, None)


class RunOutcome(msgspec.Struct, frozen=True):
    run: str
    session: str
    status: RunStatus
    stop_reason: StopReason
    answer: str | None
    checkpoint: CheckpointResult
    error: str | None
    run_dir: Path
    follow_up: bool

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run,
            "session": self.session,
            "status": self.status.value,
            "answer": self.answer,
            "checkpoint": self.checkpoint.label,
            "stop_reason": self.stop_reason.value,
        }
        if self.error:
            out["error"] = self.error
        return out
