"""What a run is asked to do and what it comes to, as values: the request, the checkpoint step's
contract (``SettledTurn`` in, ``CheckpointResult`` out), what the task turn ended with
(``TaskEnd``), the verdict drawn from those values, and the outcome."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
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
    "CheckpointDecision",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "NotTried",
    "PiFailed",
    "PiSettled",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
    "TaskEnd",
    "Verdict",
    "decision_text",
    "recorded_decision",
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
    images: tuple[dict[str, Any], ...] = ()
    """Images after the text: pi's ``ImageContent`` (``{"type":"image","data","mimeType"}``),
    sent with the prompt and kept in the request row (tether.images)."""


class CheckpointStatus(enum.StrEnum):
    NOT_NEEDED = "not_needed"
    WRITTEN = "written"
    REFUSED = "refused"


class CheckpointDecision(enum.StrEnum):
    """What became of the checkpoint (docs/operations.md#traces): written, refused (the summary was
    tried
    and did not become one), or not tried (the step decided against sending ``compact``)."""

    WRITTEN = "written"
    REFUSED = "refused"
    NOT_TRIED = "not_tried"


class NotTried(enum.StrEnum):
    """Why no checkpoint was tried."""

    UNDER_BUDGET = "under_budget"
    """The working view fits the follow-up budget: nothing to do."""
    STOP_IN_PROGRESS = "stop_in_progress"
    TOO_LITTLE_TIME = "too_little_time"
    """Less than the agent's ``checkpoint_min_time_s`` of the deadline was left."""
    NO_EXTENSION = "no_extension"
    """pi did not load the continuation extension."""
    TURN_NOT_SUCCESSFUL = "turn_not_successful"
    """The task turn failed, was stopped or aborted: only a settled, successful turn counts."""
    NO_STEP = "no_step"
    """The run was started without a checkpoint step."""
    PI_UNREACHABLE = "pi_unreachable"
    """pi went away, or its command FIFO is missing, before ``compact`` could be sent."""
    ROWS_NOT_STORED = "rows_not_stored"
    """The turn's rows are not all in the ledger, so no checkpoint could cover them."""


class CheckpointResult(msgspec.Struct, frozen=True):
    status: CheckpointStatus
    reason: ReceiptReason | None = None
    """Why it was refused (the receipt's reason); None unless ``REFUSED``."""
    refuse_session: str | None = None
    """When set, the session refuses further prompts with this reason (pi's idle was not
    confirmed, or the checkpoint's delivery is unknown)."""
    not_tried: NotTried | None = None
    """Set when ``compact`` was never sent, and why (the label keeps saying ``not_needed`` or
    ``refused:cancelled`` as it always did)."""

    @classmethod
    def refused(cls, reason: ReceiptReason, refuse_session: str | None = None) -> CheckpointResult:
        return cls(CheckpointStatus.REFUSED, reason, refuse_session)

    @classmethod
    def skipped(cls, why: NotTried, refuse_session: str | None = None) -> CheckpointResult:
        """Not tried by the step although the view is over the budget: refused (its receipt
        says ``cancelled``), and why."""
        return cls(CheckpointStatus.REFUSED, ReceiptReason.CANCELLED, refuse_session, why)

    @classmethod
    def not_needed(cls, why: NotTried) -> CheckpointResult:
        """Not tried, and nothing is owed: under the budget, or no step ran at all."""
        return cls(CheckpointStatus.NOT_NEEDED, not_tried=why)

    @property
    def decision(self) -> CheckpointDecision:
        if self.status is CheckpointStatus.WRITTEN:
            return CheckpointDecision.WRITTEN
        if self.status is CheckpointStatus.NOT_NEEDED or self.not_tried is not None:
            return CheckpointDecision.NOT_TRIED
        return CheckpointDecision.REFUSED

    @property
    def why(self) -> str | None:
        """The decision's reason: a ``NotTried`` value, or the receipt's reason."""
        if self.decision is CheckpointDecision.NOT_TRIED:
            return (self.not_tried or NotTried.UNDER_BUDGET).value
        if self.status is CheckpointStatus.REFUSED:
            return (self.reason or ReceiptReason.CANCELLED).value
        return None

    def record(self) -> dict[str, str | None]:
        """What the run's record keeps of it (``extra["checkpoint_decision"]``)."""
        return {"decision": self.decision.value, "reason": self.why}

    @property
    def label(self) -> str:
        """``written``, ``refused:<reason>`` or ``not_needed`` (docs/cli.md#tether-run)."""
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
    wait for the ``compact`` answer may end (docs/contracts.md#compaction-rows: the compaction's
    answer or a
    correlated abort answer)."""
    facts: dict[str, Any] = msgspec.field(default_factory=dict)
    """What the step measured, for the checkpoint's span: ``view_bytes``, ``budget_bytes``,
    ``remaining_s``, ``provider_ms`` (``compact`` sent to answered), ``summary_bytes``, and
    ``summary_call`` (the summary's provider call, for its ``chat`` span)."""

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock.now())


CheckpointStep = Callable[[SettledTurn], Awaitable[CheckpointResult]]


def recorded_decision(extra: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """The checkpoint decision and its reason a run's record keeps (``tether log``, the session
    page); None for a run that has none (not ended, or ended before it was recorded)."""
    found = extra.get("checkpoint_decision")
    if not isinstance(found, dict) or not isinstance(found.get("decision"), str):
        return None
    reason = found.get("reason")
    return found["decision"], reason if isinstance(reason, str) else None


def decision_text(extra: Mapping[str, Any]) -> str | None:
    """``written``, ``refused (<reason>)`` or ``not tried (<reason>)``, with the run's
    ``checkpoint_detail`` when it has one; None when the run has no decision recorded."""
    found = recorded_decision(extra)
    if found is None:
        return None
    decision, reason = found
    text = decision.replace("_", " ") + (f" ({reason.replace('_', ' ')})" if reason else "")
    detail = extra.get("checkpoint_detail")
    return f"{text}: {detail}" if isinstance(detail, str) and detail else text


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
