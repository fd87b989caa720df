"""Erasing sessions whose run is live (docs/operations.md#erasure-and-retention, issue 31): the run
is stopped first,
whichever process or host owns it, then the erasure is carried out.

    done = await erase_stopping(ledger, config, Selector(SelectorKind.SESSION, "s1"),
                                actor="user:op", say=print)

1. The sessions the erasure touches are marked as being erased (:mod:`tether.ledger.erasing`):
   they refuse new prompts and no queued run of theirs is claimed, so no run becomes live
   between the stop and the erasure.
2. Each live run on them is asked, through the ledger, to stop softly (its harness reads the
   request within a second and aborts pi, which settles); after ``stop_grace_s`` the runs still
   live are asked to stop at once (pi is killed). Meanwhile the lapsed leases of those sessions
   are reconciled as custody recovery does (``tether recover``): a run whose owner is gone is
   ended (or resumed, and then it sees the stop like any run).
3. A run that is still live after that makes the erasure fail (:class:`SessionBusy`, nothing
   erased), naming its owner and when its lease expires.
4. The erasure, in one transaction that checks again that no run is live on the sessions.
5. The marks go (a session erased whole goes with them).
6. A session erased whole loses its workspace (:func:`tether.pi.workspace.remove_workspace`:
   its files; a worktree with its branch).

``tether erase``, ``POST /v1/erasures`` and retention (``tether retention apply``, the workers)
all erase through here. A dry run stops nothing: it lists the live runs it would stop.
"""

from __future__ import annotations

import datetime
import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec

from tether.config import Config
from tether.errors import NotFound, SessionBusy, TetherError
from tether.harness.custody.reconcile import reconcile
from tether.ledger import Ledger, Run, RunStatus
from tether.ledger.lifecycle import Erased, Selector, SelectorKind, erase_selected
from tether.pi.launch import runs_dir
from tether.pi.workspace import remove_workspace, workspace_home
from tether.threads import in_thread

__all__ = [
    "DEFAULT_STOP_GRACE_S",
    "ERASING_DETAIL",
    "StopHow",
    "erase_stopping",
    "retention_stopping",
]

log = logging.getLogger(__name__)

DEFAULT_STOP_GRACE_S = 5.0
"""How long a live run is given to settle after a soft stop before it is stopped at once."""
ERASING_DETAIL = "the session is being erased"
POLL_S = 0.2
"""How often the erasure reads whether the runs it stopped have ended."""
RECONCILE_EVERY_S = 1.0
ATTEMPTS = 3
"""Plans tried: a source erasure can reach a session that a live run wrote the source into
after the plan was made; it is marked and its run stopped in the next round."""

Say = Callable[[str], None]


class StopHow(enum.StrEnum):
    """How a run the erasure stopped ended."""

    SOFT = "soft"
    """Within the grace of the soft stop."""
    HARD = "hard"
    """After the hard stop."""
    RECOVERED = "recovered"
    """Its owner was gone: custody's reconcile ended it (or resumed it, and it stopped)."""


def _quiet(_: str) -> None:
    return None


async def erase_stopping(
    ledger: Ledger,
    config: Config,
    selector: Selector,
    *,
    actor: str,
    stop_grace_s: float = DEFAULT_STOP_GRACE_S,
    dry_run: bool = False,
    say: Say = _quiet,
    idle_before: str | None = None,
) -> Erased | None:
    """Stop the live runs on the sessions ``selector`` touches, then erase it (see the module).
    With ``idle_before`` (retention, a session selector), the session is erased only if it is
    still idle when it is marked: None when it is not."""
    rdir = runs_dir(config)
    if dry_run:
        done = await in_thread(
            erase_selected, ledger, selector, actor=actor, runs_dir=rdir, dry_run=True
        )
        live = [
            {"run": r.id, "session": r.session, "status": r.status.value}
            for s in done.plan.affected_sessions
            for r in await in_thread(ledger.live_runs, session=s)
        ]
        kept = tuple(s for s in done.plan.sessions if workspace_home(config, s).exists())
        return msgspec.structs.replace(done, stopped=tuple(live), workspaces=kept)
    marked: list[str] = []
    stopped: list[dict[str, Any]] = []
    try:
        if idle_before is not None:
            if selector.kind is not SelectorKind.SESSION:
                raise ValueError("idle_before applies to a session selector")
            marked += await in_thread(
                ledger.begin_erasure, [selector.value], actor=actor, idle_before=idle_before
            )
            if not marked:
                return None  # it is not idle any more (or it is gone)
        for attempt in range(ATTEMPTS):
            plan = await in_thread(ledger.plan_erasure, selector)
            wanted = [s for s in plan.affected_sessions if s not in marked]
            if wanted:
                marked += await in_thread(ledger.begin_erasure, wanted, actor=actor)
            stopped += await _stop_live(ledger, config, marked, stop_grace_s, actor, say)
            try:
                done = await in_thread(erase_selected, ledger, selector, actor=actor, runs_dir=rdir)
            except SessionBusy:
                if attempt == ATTEMPTS - 1:
                    raise
                continue
            removed = []
            for session in done.plan.sessions:
                if await in_thread(remove_workspace, config, session) is not None:
                    removed.append(session)
            return msgspec.structs.replace(done, stopped=tuple(stopped), workspaces=tuple(removed))
        raise AssertionError("unreachable: the last attempt returns or raises")
    finally:
        with anyio.CancelScope(shield=True):
            await in_thread(ledger.end_erasure, marked)


async def retention_stopping(
    ledger: Ledger,
    config: Config,
    idle_days: int,
    *,
    actor: str,
    now: datetime.datetime | None = None,
    dry_run: bool = False,
    say: Say = _quiet,
) -> list[Erased]:
    """Erase every session idle for ``idle_days`` (docs/operations.md#erasure-and-retention), one
    receipt each, through
    :func:`erase_stopping`. A session that stopped being idle since it was listed (a run
    queued or started on it) is passed by: an idle session has no live run to stop."""
    moment = now or datetime.datetime.now(datetime.UTC)
    cutoff = (moment - datetime.timedelta(days=idle_days)).isoformat().replace("+00:00", "Z")
    done: list[Erased] = []
    for session in await in_thread(ledger.idle_sessions, cutoff):
        try:
            found = await erase_stopping(
                ledger,
                config,
                Selector(SelectorKind.SESSION, session),
                actor=actor,
                dry_run=dry_run,
                say=say,
                idle_before=cutoff,
            )
        except NotFound:
            continue  # erased meanwhile (another worker)
        if found is not None:
            done.append(found)
    return done


async def _stop_live(
    ledger: Ledger,
    config: Config,
    sessions: Sequence[str],
    grace_s: float,
    actor: str,
    say: Say,
) -> list[dict[str, Any]]:
    """Stop every live run on ``sessions``: soft, then hard; their ends as the erasure reports
    them. Raises :class:`SessionBusy` when one is still live after both."""
    live: list[Run] = []
    for s in sessions:
        live += await in_thread(ledger.live_runs, session=s)
    if not live:
        return []
    detail = f"{ERASING_DETAIL} (by {actor})"
    for r in live:
        say(f"stopping run {r.id} on session {r.session} (soft)…")
        await in_thread(ledger.request_stop, r.id, hard=False, detail=detail, actor=actor)
    recovered: set[str] = set()
    after_soft = await _wait(ledger, config, live, grace_s, recovered, say)
    for r in after_soft:
        say(f"run {r.id} did not settle within {grace_s:g}s: stopping it (hard)…")
        await in_thread(ledger.request_stop, r.id, hard=True, detail=detail, actor=actor)
    # A hard stop kills pi at once; its harness then closes and records the end. An owner
    # that is gone leaves its lease to expire, and reconcile ends the run then.
    bound = 2 * config.harness.stop_grace_s + config.custody.lease_s + 5
    left = await _wait(ledger, config, after_soft, bound, recovered, say)
    if left:
        raise await _still_live(ledger, left[0], grace_s + bound)
    hard = {r.id for r in after_soft}
    out: list[dict[str, Any]] = []
    for r in live:
        ended = await in_thread(ledger.run, r.id)
        how = (
            StopHow.RECOVERED
            if r.id in recovered
            else StopHow.HARD
            if r.id in hard
            else StopHow.SOFT
        )
        status = ended.status.value if ended else None
        reason = ended.extra.get("stop_reason") if ended else None
        say(f"run {r.id} ended {status} ({reason or 'no stop reason'})")
        out.append(
            {
                "run": r.id,
                "session": r.session,
                "how": how.value,
                "status": status,
                "stop_reason": reason,
            }
        )
    return out


async def _wait(
    ledger: Ledger,
    config: Config,
    runs: Sequence[Run],
    within: float,
    recovered: set[str],
    say: Say,
) -> list[Run]:
    """Wait up to ``within`` seconds for ``runs`` to end, reconciling the lapsed leases of
    their sessions meanwhile (what ``tether recover`` does); the runs still live."""
    deadline = time.monotonic() + within
    next_reconcile = time.monotonic()
    left = list(runs)
    while True:
        still = []
        for r in left:
            found = await in_thread(ledger.run, r.id)
            if found is not None and found.status is RunStatus.RUNNING:
                still.append(r)
        left = still
        now = time.monotonic()
        if not left or now >= deadline:
            return left
        if now >= next_reconcile:
            for session in sorted({r.session for r in left}):
                try:
                    done = await reconcile(ledger, config, session=session)
                except TetherError as exc:
                    log.warning("reconciling session %s failed (%s); waiting on", session, exc)
                    continue
                for d in done:
                    say(f"run {d.run}'s owner was gone: {d.resolution.value}")
                    recovered.add(d.run)
            next_reconcile = time.monotonic() + RECONCILE_EVERY_S
        await anyio.sleep(POLL_S)


async def _still_live(ledger: Ledger, run: Run, waited: float) -> SessionBusy:
    lease = await in_thread(ledger.lease, run.id)
    owner = "an unknown owner"
    expires = ""
    if lease is not None:
        host = (lease.placement or {}).get("host")
        owner = f"{lease.owner or 'an unknown owner'}" + (f" on host {host}" if host else "")
        if lease.expires is not None:
            when = datetime.datetime.fromtimestamp(lease.expires, datetime.UTC)
            expires = f" (its lease expires at {when.isoformat(timespec='seconds')})"
    return SessionBusy(
        run.session,
        run.id,
        f"run {run.id} on session {run.session} did not end within {waited:g}s of being asked "
        f"to stop, soft then hard; nothing was erased. Its owner is {owner}{expires}: if that "
        "process is gone, run `tether recover` once the lease has expired (it ends the run), "
        "then erase again",
    )
