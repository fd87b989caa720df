"""The fixed facts of one claimed run, grouped (the driver, the preparation and the end read
them; none of them changes while the run is driven)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tether.access import Obligations
from tether.clock import Clock
from tether.config import AgentConfig, Config
from tether.events import EventBus
from tether.harness.custody.owner import NewerOwner
from tether.harness.relay import RelayHook
from tether.harness.stops import StopControl, Stopped, StopReason
from tether.harness.traces import RunTrace
from tether.harness.turn import CheckpointStep, RunRequest
from tether.ledger import Fence, Ledger
from tether.ledger.usage import DayBudget
from tether.mirror.entries import Actors
from tether.pi.install import PiInstall
from tether.pi.launch import PiLaunch

__all__ = ["ClaimedRun", "PiStart", "Progress", "RunControls"]


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """Which run, where, for whom."""

    ledger: Ledger
    config: Config
    fence: Fence
    request: RunRequest
    run_dir: Path
    workdir: Path
    pi: PiInstall
    actors: Actors = field(init=False)
    """One for the run: the relay records a relayed request's sender in it (``relayed``) and
    the mirror reads it there, so both must hold the same one."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "actors", Actors(user=self.request.actor, agent=self.request.agent)
        )

    @property
    def agent(self) -> AgentConfig:
        return self.config.agent(self.request.agent)

    @property
    def grace(self) -> float:
        return self.config.harness.stop_grace_s


class RunControls(msgspec.Struct, frozen=True):
    """What bounds and watches the run: its clock and deadline, its stops, its events, and
    the steps given to it (the checkpoint, the relay of live requests)."""

    clock: Clock
    deadline: float
    stop: StopControl
    bus: EventBus
    checkpoint: CheckpointStep | None = None
    relay: RelayHook | None = None
    trace: RunTrace = msgspec.field(default_factory=RunTrace)
    """The run's spans (no-ops when tracing is off)."""
    budget: DayBudget | None = None
    """The requesting actor's day budget (``[service.budgets]``; the service's runs): the run
    writes its usage as it goes and is stopped softly once its actor's day reaches it
    (tether.harness.usage)."""


class PiStart(msgspec.Struct, frozen=True):
    """How pi is to be had: its provider keys (for a child pi), or pi started ahead of the run
    and held at its gate (custody), or why that start failed."""

    keys: dict[str, str] = msgspec.field(default_factory=dict)
    launch: PiLaunch | None = None
    start_error: OSError | None = None


class Progress(msgspec.Struct):
    """What the driver learns as the run goes (the rest of what pi was seen doing is in
    :class:`tether.harness.pump.RunState`)."""

    obligations: Obligations = msgspec.field(default_factory=Obligations)
    """The sources of everything the run was given; every row it writes carries them."""
    prompted: bool = False
    """pi took the prompt (so an abort waits for it to settle)."""
    resuming: bool = False
    """Taking over a run whose harness was lost (pi was prompted by the lost harness)."""
    failure: Stopped | None = None
    """The harness's own failure (a helper task, the final mirror pass): it wins."""

    taken_over: NewerOwner | None = None
    """The owner that took the run over from this harness: pi is its own now."""

    def failed(self, failure: Stopped) -> None:
        """Keep the first failure."""
        self.failure = self.failure or failure

    def handed_over(self, found: NewerOwner, mine: int) -> Stopped:
        """A newer owner holds the run: that is the harness's failure, naming the owner (it
        replaces a fenced-out write's failure, which could not name it)."""
        self.taken_over = found
        failure = Stopped(StopReason.FENCED_OUT, hard=True, detail=found.describe(mine))
        if self.failure is None or self.failure.reason is StopReason.FENCED_OUT:
            self.failure = failure
        return failure
