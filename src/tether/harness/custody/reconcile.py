"""Reconciling live runs whose custody lapsed (docs/architecture.md#custody, invariants 15-17).

A live run's lease lapses when its harness stops heartbeating (the lease expired), or at once
when, on this host, its harness process is confirmed gone. Whoever touches the session next
(``tether run``, a worker) or ``tether recover`` reconciles it, taking the run over with a new
epoch (of several reconcilers exactly one wins), and then, by its placement:

- confirmed on this host and pi still running (same pid, same start time) → **resume**: attach
  to pi's keeper, mirror what was not mirrored, finish the run on the original pi;
- confirmed on this host and pi gone → ``interrupted`` with ``harness_lost``; whatever pi wrote
  to its session file is mirrored, and the mirrored answer stays the reply;
- not confirmable (another host id, or no placement recorded) → ``interrupted`` with
  ``unconfirmed_ending``, and the session refuses prompts until an operator clears it: custody
  is retained, never guessed.

    done = await reconcile(ledger, config)            # every lapsed lease (tether recover)
    done = await reconcile(ledger, config, session="s1")
"""

from __future__ import annotations

import contextlib
import enum
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from tether import telemetry
from tether.clock import Clock, SystemClock
from tether.config import Config
from tether.errors import FencedOut, RunNotActive
from tether.events import EventBus, Resumed, Subscriber
from tether.files import open_own
from tether.harness.checkpoint import continuation_checkpoint
from tether.harness.claimed import queued_request
from tether.harness.context import ClaimedRun, PiStart, RunControls
from tether.harness.custody import placement as place
from tether.harness.custody.recovery import settle_lost_checkpoint
from tether.harness.custody.state import has_run_state, load_run_state
from tether.harness.driver import Driver
from tether.harness.ending import drive_recorded
from tether.harness.relay import RelayHook
from tether.harness.stops import StopControl
from tether.harness.stranded import record_stranded_ends
from tether.harness.traces import run_trace, takeover_span
from tether.harness.turn import RunOutcome
from tether.ledger import Fence, Ledger, Run, RunStatus
from tether.mirror.announced import Announced
from tether.mirror.entries import Actors
from tether.mirror.mirror import Mirror
from tether.pi import keeper
from tether.pi.detached import read_placement
from tether.pi.install import PiInstall, find_pi
from tether.pi.launch import runs_dir
from tether.pi.workspace import session_workdir
from tether.processes import alive, start_time
from tether.sandbox.limits import LimitHit, LimitWatch
from tether.threads import in_thread

__all__ = ["Reconciled", "Resolution", "lapsed", "reconcile"]


class Resolution(enum.StrEnum):
    RESUMED = "resumed"
    """Finished on its original pi (see ``outcome``)."""
    HARNESS_LOST = "harness_lost"
    """pi was confirmed gone: the run ended ``interrupted``."""
    UNCONFIRMED_ENDING = "unconfirmed_ending"
    """Placement not confirmable: the run ended ``interrupted``, the session refuses prompts."""


class Reconciled(msgspec.Struct, frozen=True):
    run: str
    session: str
    resolution: Resolution
    outcome: RunOutcome | None = None
    """The resumed run's outcome (``RESUMED`` only)."""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run,
            "session": self.session,
            "resolution": self.resolution.value,
        }
        if self.outcome is not None:
            out["outcome"] = self.outcome.to_json()
        if self.detail:
            out["detail"] = self.detail
        return out


def lapsed(ledger: Ledger, *, session: str | None = None) -> list[Run]:
    """Live runs whose custody lapsed: the lease expired, or (on this host) the harness that
    holds it is confirmed gone."""
    out = ledger.expired_leases(session=session)
    seen = {r.id for r in out}
    for run in ledger.live_runs(session=session):
        if run.id in seen:
            continue
        lease = ledger.lease(run.id)
        if lease is not None and place.harness_gone(lease.placement):
            out.append(run)
    return out


async def reconcile(
    ledger: Ledger,
    config: Config,
    *,
    session: str | None = None,
    subscribers: Sequence[Subscriber] = (),
    pi: PiInstall | None = None,
    clock: Clock | None = None,
    relay: RelayHook | None = None,
) -> list[Reconciled]:
    """Reconcile every lapsed lease (of ``session``, or all) per docs/architecture.md#custody. A
    run another
    reconciler took first is skipped. A resumed run gets ``relay`` (the takeover inherits the
    relay of requests into the live run). Then queued runs heading their queue whose waiting
    ``tether run`` is gone are withdrawn (:func:`withdraw_abandoned`). Run ends kept on disk
    because the ledger could not take them are recorded first, so that no lapsed lease ends
    such a run as lost."""
    await in_thread(record_stranded_ends, ledger, runs_dir(config))
    done: list[Reconciled] = []
    for run in await in_thread(lapsed, ledger, session=session):
        found = await _reconcile_one(ledger, config, run, subscribers, pi, clock, relay)
        if found is not None:
            done.append(found)
    await withdraw_abandoned(ledger, session=session)
    return done


async def withdraw_abandoned(ledger: Ledger, *, session: str | None = None) -> list[str]:
    """Queued runs that head their session's queue, whose waiter (a ``tether run`` on this
    host) is confirmed gone: withdrawn (they wrote nothing). Workers pass such a run by, since
    it is its waiter's to run; withdrawn, the session's next request is theirs."""
    withdrawn = []
    for run, waiter in await in_thread(ledger.waited_heads, session=session):
        if place.harness_gone(waiter) and await in_thread(ledger.cancel_queued, run.id):
            withdrawn.append(run.id)
    return withdrawn


async def _reconcile_one(
    ledger: Ledger,
    config: Config,
    run: Run,
    subscribers: Sequence[Subscriber],
    pi: PiInstall | None,
    clock: Clock | None,
    relay: RelayHook | None = None,
) -> Reconciled | None:
    lease = await in_thread(ledger.lease, run.id)
    if lease is None:
        return None  # it ended meanwhile
    ours = None
    if lease.placement is not None and lease.placement.get("host") == place.host_id():
        # Same host: this process now holds it, where pi was (a resume keeps pi's record).
        ours = {
            **lease.placement,
            **place.placement(pi=None, run_dir=Path(str(lease.placement.get("run_dir", "")))),
        }
    fence = await in_thread(
        ledger.take_over,
        run.id,
        epoch=lease.epoch,
        owner=place.owner_id(),
        lease_s=config.custody.lease_s,
        placement=ours,
    )
    if fence is None:
        return None  # another reconciler (or the holder) got there first
    taken = takeover_span(run, lease.epoch)
    try:
        found = await _taken_over(
            ledger, config, run, fence, lease.placement, subscribers, pi, clock, relay
        )
        taken.set({"tether.custody.resolution": found.resolution.value if found else None})
    except BaseException as exc:
        taken.fail(type(exc).__name__)
        raise
    finally:
        taken.end()
    return found


async def _taken_over(
    ledger: Ledger,
    config: Config,
    run: Run,
    fence: Fence,
    where: dict[str, Any] | None,
    subscribers: Sequence[Subscriber],
    pi: PiInstall | None,
    clock: Clock | None,
    relay: RelayHook | None,
) -> Reconciled | None:
    """What becomes of a run taken over: resumed, ended as lost, or ended unconfirmed."""
    run_dir = Path(where["run_dir"]) if where and where.get("run_dir") else None
    if where is None or where.get("host") != place.host_id() or run_dir is None:
        why = (
            "no placement was recorded"
            if where is None
            else f"it was placed on host {where.get('host')!r}, not this one ({place.host_id()})"
        )
        return await _unconfirmed(ledger, fence, why)
    keeper_place = read_placement(run_dir)
    if keeper_place is not None and "pi_pid" not in where:
        # The harness died after pi started but before it recorded where: the keeper's own
        # record (in the run directory on this host) names pi.
        where = {**where, **_confirmed_by_keeper(keeper_place, run_dir)}
    same_pi = keeper_place is not None and keeper_place.get("pi_pid") == where.get("pi_pid")
    if same_pi and alive(where.get("pi_pid"), where.get("pi_start")) and has_run_state(run_dir):
        # Resumed even without its FIFO: pi's events are followed to its end, its answer
        # mirrored, and the driver, finding no command channel, attempts no checkpoint and
        # has the session refuse prompts (docs/architecture.md#custody).
        return await _resume(ledger, config, run, fence, where, subscribers, pi, clock, relay)
    if alive(where.get("pi_pid"), where.get("pi_start")):
        # pi lives but its keeper's record does not name it: it cannot be followed nor
        # confirmed idle. What it wrote is mirrored first (the answer is kept), then it is
        # ended the way a lost harness would have, and the session refuses prompts.
        found = await _mirror_what_pi_wrote(ledger, run, fence, run_dir)
        if found is None:
            return None
        _stop_pi(where)
        return await _unconfirmed(
            ledger,
            fence,
            "pi was alive but its keeper's record does not name it",
            answer=found.answer,
            checkpoint=found.checkpoint,
        )
    return await _harness_lost(ledger, run, fence, run_dir)


def _confirmed_by_keeper(keeper_place: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """pi's and its keeper's pids with start times, confirmed without a recorded start time:
    the keeper runs with this run directory on its command line and pi is its child."""
    keeper_pid, pi_pid = keeper_place.get("keeper_pid"), keeper_place.get("pi_pid")
    if not isinstance(keeper_pid, int) or not isinstance(pi_pid, int):
        return {}
    import psutil  # here, not at every run's reconcile (8 ms of its start)

    try:
        keeper_proc = psutil.Process(keeper_pid)
        pi_proc = psutil.Process(pi_pid)
        if str(run_dir) not in keeper_proc.cmdline() or pi_proc.ppid() != keeper_pid:
            return {}
        return {
            "keeper_pid": keeper_pid,
            "keeper_start": start_time(keeper_pid),
            "pi_pid": pi_pid,
            "pi_start": start_time(pi_pid),
        }
    except psutil.Error:
        return {}


async def _unconfirmed(
    ledger: Ledger,
    fence: Fence,
    why: str,
    *,
    answer: str | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> Reconciled | None:
    detail = f"the harness of run {fence.run} was lost and its placement cannot be confirmed: {why}"
    extra: dict[str, Any] = {
        "stop_reason": Resolution.UNCONFIRMED_ENDING.value,
        "error": detail,
        **(checkpoint or {}),
    }
    if answer is not None:
        extra["answer"] = answer
    try:
        await in_thread(ledger.end_run, fence, RunStatus.INTERRUPTED, extra=extra)
    except (FencedOut, RunNotActive):
        return None
    await in_thread(ledger.set_refusing, fence.session, f"unconfirmed_ending: {detail}")
    return Reconciled(fence.run, fence.session, Resolution.UNCONFIRMED_ENDING, detail=detail)


def _stop_pi(where: dict[str, Any]) -> None:
    """Signal pi's group only after matching its start time (pid reuse)."""
    pid = where.get("pi_pid")
    if isinstance(pid, int) and alive(pid, where.get("pi_start")):
        keeper.signal_group(pid, signal.SIGKILL)


class _Mirrored(msgspec.Struct, frozen=True):
    answer: str | None
    problems: list[str]
    limits_hit: list[LimitHit] = msgspec.field(default_factory=list)
    checkpoint: dict[str, Any] = msgspec.field(default_factory=dict)
    """What the run's record says of a checkpoint it had sent (``settle_lost_checkpoint``)."""


async def _mirror_what_pi_wrote(
    ledger: Ledger, run: Run, fence: Fence, run_dir: Path
) -> _Mirrored | None:
    """Mirror what pi wrote to its session file (exactly once, by entry id) and find its last
    answer: done before anything ends pi, so the answer is never lost with it. None when a
    newer owner took the run meanwhile."""
    try:
        saved = load_run_state(run_dir)
    except (OSError, ValueError):
        return _Mirrored(None, [])
    if run.request_seq is None:
        return _Mirrored(None, [])
    asked = run.extra.get("request") or {}
    session_file = run_dir / "session.jsonl"
    announced, unheard = await in_thread(_announcements, run_dir)
    mirror = Mirror(
        ledger,
        fence,
        session_file=session_file,
        actors=Actors(user=str(asked.get("actor", "user:local")), agent=run.agent),
        start_offset=saved.offset,
        known=dict(saved.known),
        request=(str(asked.get("text", "")), run.request_seq),
        # From the run's first entry: rows the lost harness wrote come back as they are.
        limits=LimitWatch() if saved.sandboxed else None,
        # Only what pi announced: its records, as its keeper kept them in the events file.
        announced=announced,
        nonce=saved.nonce,
        file_id=saved.session_file,
    )
    if unheard is not None:
        mirror.problems.append(unheard)
    try:
        await mirror.sync(final=True)
        checkpoint = await settle_lost_checkpoint(ledger, fence, mirror, run_dir)
    except (FencedOut, RunNotActive):
        return None
    return _Mirrored(mirror.last_answer, mirror.problems[:10], mirror.limits_hit, checkpoint)


def _announcements(run_dir: Path) -> tuple[Announced, str | None]:
    """What pi announced in the run, from the events file its keeper wrote (and why none were
    heard, when it cannot be read: then no entry of its session file is mirrored)."""
    from tether.pi.jsonl import decode

    announced = Announced()
    path = run_dir / keeper.EVENTS_NAME
    try:
        with open_own(path) as f:
            data = f.read()
    except OSError as exc:  # ForeignFile among them: never read
        return announced, f"pi's events were not read ({exc}): nothing it wrote is mirrored"
    for line in data.split(b"\n"):
        if line.strip():
            with contextlib.suppress(ValueError):
                announced.hear(decode(line))
    return announced, None


async def _harness_lost(ledger: Ledger, run: Run, fence: Fence, run_dir: Path) -> Reconciled | None:
    """pi is confirmed gone: mirror what it wrote (exactly once, by entry id) and end the run
    ``interrupted`` (``harness_lost``), its answer the reply."""
    found = await _mirror_what_pi_wrote(ledger, run, fence, run_dir)
    if found is None:
        return None
    detail = f"the harness of run {fence.run} was lost and pi is gone"
    extra: dict[str, Any] = {
        "stop_reason": Resolution.HARNESS_LOST.value,
        "answer": found.answer,
        "error": detail,
        **found.checkpoint,
    }
    if found.problems:
        extra["mirror_problems"] = found.problems
    if found.limits_hit:
        extra["limits_hit"] = msgspec.to_builtins(found.limits_hit)
    try:
        await in_thread(ledger.end_run, fence, RunStatus.INTERRUPTED, extra=extra)
    except (FencedOut, RunNotActive):
        return None
    return Reconciled(fence.run, fence.session, Resolution.HARNESS_LOST, detail=detail)


async def _resume(
    ledger: Ledger,
    config: Config,
    run: Run,
    fence: Fence,
    where: dict[str, Any],
    subscribers: Sequence[Subscriber],
    pi: PiInstall | None,
    clock: Clock | None,
    relay: RelayHook | None = None,
) -> Reconciled | None:
    """Finish the run on its original pi (see :meth:`Driver.resume`)."""
    request = queued_request(
        run.id,
        run.session,
        run.agent,
        run.extra.get("request") or {},
        checkpoint=True,
        images=run.extra.get("images"),  # tether.images.IMAGES_KEY
    )
    run_dir = Path(where["run_dir"])
    saved = load_run_state(run_dir)
    clock = clock or SystemClock()
    remaining = max(0.0, saved.deadline_at - _now())
    bus = EventBus(list(subscribers))
    agent = config.agent(run.agent)
    # The resumed run's spans join the run's trace, under the span its first harness opened.
    trace = await run_trace(
        ledger,
        fence,
        run,
        request,
        model=agent.model,
        provider=config.providers.get(agent.provider),
        content=config.telemetry.content,
        resumed=True,
    )
    driver = Driver(
        ClaimedRun(
            ledger=ledger,
            config=config,
            fence=fence,
            request=request,
            run_dir=run_dir,
            workdir=session_workdir(config, run.agent, run.session),
            pi=pi or find_pi(),
        ),
        RunControls(
            clock=clock,
            deadline=clock.now() + remaining,
            stop=StopControl(),
            bus=bus,
            checkpoint=continuation_checkpoint,
            relay=relay,
            trace=trace,
        ),
        PiStart(),  # pi runs already: it read its key at start
    )
    bus.emit(Resumed(run=run.id, session=run.session, pi_pid=int(where["pi_pid"])))
    try:
        outcome = await drive_recorded(
            driver.resume(where),
            ledger=ledger,
            fence=fence,
            bus=bus,
            answer=lambda: driver.state.answer,
        )
        trace.ended(outcome)
    except BaseException as exc:
        trace.failed(exc)
        raise
    finally:
        trace.span.end()
        if trace:
            telemetry.flush_later()
    return Reconciled(run.id, run.session, Resolution.RESUMED, outcome=outcome)


def _now() -> float:
    return time.time()
