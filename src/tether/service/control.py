"""Acting on runs and sessions over the API: stop a live run, withdraw a queued one (its requester
or an actor of ``[service] operators``), clear a refusing session (operators only). Each is
recorded with its actor: ``stopped_by`` and ``withdrawn_by`` in the run's record, a receipt in
the session's record (``extra["cleared"]``) for a clear.

A stop reaches the run wherever it runs (another serve process, a ``tether worker`` on another
host, a ``tether run``) the way an erasure's stop does: a stop request in the ledger
(:meth:`~tether.ledger.erasing.ErasingSql.request_stop`) that the run's harness reads every
second and carries out through its own ``StopControl``; the run then ends as any stopped run
does (``soft_stop``, or ``hard_stop``; a soft stop that does not see pi settle within
``[harness] stop_grace_s`` escalates).
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict

from tether.harness.custody.placement import host_id
from tether.ledger import RunStatus
from tether.ledger.models import Run, now_iso
from tether.processes import alive
from tether.service.api import CallerDep, RunId, SessionId, StateDep, blocking
from tether.service.auth import Caller
from tether.service.state import ServiceState

__all__ = ["ClearIn", "StopIn", "leftover_pi", "router"]

router = APIRouter(prefix="/v1", tags=["v1"])


class StopIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hard: bool = False
    """False: pi is asked to abort and given ``[harness] stop_grace_s`` to settle (then killed);
    true: pi is killed at once."""


class ClearIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pi_checked: bool = False
    """The operator checked by hand that no pi of the session's last run is left on the host it
    ran on; needed when that host is not this server's (this server can look only at its own)."""


def _requester(run: Run) -> str | None:
    request = run.extra.get("request")
    return request.get("actor") if isinstance(request, dict) else None


def _run_for(st: ServiceState, run_id: str, who: Caller, doing: str) -> Run:
    """The run, for its requester or an operator: 404 unknown, 403 anyone else."""
    found = st.ledger.run(run_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run_id!r}")
    if who.actor != _requester(found) and who.actor not in st.config.service.operators:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{who.actor} may not {doing} run {run_id}: only the actor that requested it or an "
            "actor in [service] operators may",
        )
    return found


@router.post(
    "/runs/{run}/stop",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Stop a live run (its requester or an operator)",
)
async def stop_run(run: RunId, who: CallerDep, st: StateDep, body: StopIn | None = None) -> Any:
    hard = body.hard if body is not None else False

    def stop() -> dict[str, Any]:
        found = _run_for(st, run, who, "stop")
        if found.status is RunStatus.QUEUED:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"run {run} is queued, not live: withdraw it with DELETE /v1/runs/{run}",
            )
        how = "hard" if hard else "soft"
        asked = found.status is RunStatus.RUNNING and st.ledger.request_stop(
            run, hard=hard, detail=f"stopped by {who.actor} over the API ({how})", actor=who.actor
        )
        if not asked:
            current = st.ledger.get_run(run).status.value
            raise HTTPException(
                status.HTTP_409_CONFLICT, f"run {run} is {current}: there is nothing to stop"
            )
        return {"run": run, "status": "stopping", "hard": hard, "stopped_by": who.actor}

    return await blocking(stop)


@router.delete("/runs/{run}", summary="Withdraw a queued run (its requester or an operator)")
async def withdraw_run(run: RunId, who: CallerDep, st: StateDep) -> dict[str, Any]:
    def withdraw() -> dict[str, Any]:
        _run_for(st, run, who, "withdraw")
        ended = st.ledger.end_queued_run(
            run,
            RunStatus.INTERRUPTED,
            extra={
                "withdrawn_by": who.actor,
                "withdrawn_at": now_iso(),
                "stop_reason": "withdrawn",
                "error": f"withdrawn by {who.actor} before it started",
            },
        )
        if ended is None:
            current = st.ledger.get_run(run).status
            hint = (
                f": stop it with POST /v1/runs/{run}/stop" if current is RunStatus.RUNNING else ""
            )
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"run {run} is {current.value}, not queued{hint}",
            )
        return {"run": run, "status": ended.status.value, "withdrawn_by": who.actor}

    return await blocking(withdraw)


@router.post("/sessions/{session}/clear", summary="Let a refusing session take prompts (operators)")
async def clear_session(
    session: SessionId, who: CallerDep, st: StateDep, body: ClearIn | None = None
) -> dict[str, Any]:
    """What ``tether session clear`` does, once this server has checked that no run of the
    session is live and no pi of its last run is left (on this host; on another host, the
    operator says so with ``pi_checked``); the clear is kept as a receipt in the session."""
    if who.actor not in st.config.service.operators:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{who.actor} may not clear a session: only the actors in [service] operators may",
        )
    checked = body.pi_checked if body is not None else False

    def clear() -> dict[str, Any]:
        if st.ledger.session(session) is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no session {session!r}")
        live = st.ledger.live_runs(session=session)
        if live:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"run {live[0].id} is live on session {session!r}: stop it first "
                f"(POST /v1/runs/{live[0].id}/stop)",
            )
        left = leftover_pi(st, session, checked)
        if left is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, left)
        was = st.ledger.clear_refusing(session, actor=who.actor, pi_checked=checked)
        return {"session": session, "cleared": was is not None, "was": was}

    return await blocking(clear)


def leftover_pi(st: ServiceState, session: str, checked: bool) -> str | None:
    """Why the session's last run may still have a pi (or its keeper, or a process it started)
    going, or None. On this host: its pi and keeper, by pid and start time, and any process
    whose pi agent directory lies in its run directory. On another host this server cannot
    look: unless the operator says it checked (``checked``), that is a reason."""
    found = st.ledger.last_placement(session)
    if found is None:
        return None
    run, where = found
    host = where.get("host")
    if host != host_id():
        if checked:
            return None
        return (
            f"run {run}, the session's last, ran on host {host!r}, which this server cannot "
            f"look at: check there that no pi of it is left (`grep -l {run} /proc/*/environ`), "
            'then send {"pi_checked": true}'
        )
    for name in ("pi", "keeper"):
        pid = where.get(f"{name}_pid")
        if alive(pid, where.get(f"{name}_start")):
            return (
                f"the {name} of run {run} (pid {pid}) is still running on this host; stop it "
                f"(kill {pid}), then clear the session"
            )
    strays = _processes_in(where.get("run_dir"))
    if strays:
        shown = ", ".join(str(p) for p in strays[:5])
        return (
            f"processes started by run {run}'s pi are still running on this host (pids "
            f"{shown}); stop them, then clear the session"
        )
    return None


def _processes_in(run_dir: object) -> list[int]:
    """Processes whose pi agent directory (``PI_CODING_AGENT_DIR``, which every process pi
    starts inherits) lies in ``run_dir``."""
    if not isinstance(run_dir, str) or not run_dir:
        return []
    import psutil

    inside = os.path.realpath(run_dir) + os.sep
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PI_CODING_AGENT_DIR", "").startswith(inside):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found
