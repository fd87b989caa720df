"""Before pi is let through (docs/cli.md#tether-run steps 2-4): the follow-up view, the run's rows
(the
view's copies, the request, fenced), pi's session file written from the view, and what a
harness taking the run over needs (:mod:`tether.harness.custody.state`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from tether.access import Obligations
from tether.clock import Clock
from tether.config import Config, SandboxKind
from tether.events import EventBus
from tether.files import FileId, file_id, private_file
from tether.followup import FollowupView, Refusal, build_view
from tether.harness.context import ClaimedRun
from tether.harness.custody.state import CustodyState, save_run_state
from tether.harness.rundir import make_run_dir
from tether.harness.turn import RunRequest
from tether.ledger import Ledger, NewRow, RowKind
from tether.mirror.announced import Announced
from tether.mirror.mirror import Mirror
from tether.pi.sessionfile import PreEntry, write_session_file
from tether.pi.toolchannel import ToolChannel
from tether.sandbox.limits import LimitWatch
from tether.threads import in_thread

__all__ = ["Prepared", "followup_view", "make_mirror", "prepare"]


class Prepared(msgspec.Struct, frozen=True):
    mirror: Mirror
    view_record: dict[str, Any] | None
    """What the run's record keeps about the view it started from (None: no history)."""
    offset: int = 0
    """Where pi's own entries start in its session file (after the view's)."""


async def followup_view(ledger: Ledger, config: Config, request: RunRequest) -> FollowupView | None:
    """The follow-up view when the session has history (None for its first run); a refused
    view raises ``Refused`` before anything is written."""
    if await in_thread(ledger.last_seq, request.session) == 0:
        return None
    view = await in_thread(
        build_view,
        ledger,
        session=request.session,
        agent=request.agent,
        actor=request.actor,
        request=request.text,
        config=config.followup,
        grants=config.access.grants,
    )
    if isinstance(view, Refusal):
        raise view.error()
    return view


def _view_record(view: FollowupView, copied: int) -> dict[str, Any]:
    return {
        "budget": view.budget,
        "bytes": view.bytes,
        "messages": len(view.messages),
        "copied": copied,
        "checkpoint": view.checkpoint.seq if view.checkpoint else None,
        "previous_request": view.previous_request.to_json() if view.previous_request else None,
        "gaps": [g.to_json() for g in view.gaps],
    }


def _request_message(text: str, images: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The request as pi will store it when it takes the prompt (its images after the text)."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, *images],
        "timestamp": int(time.time() * 1000),
    }


async def _record_request(run: ClaimedRun) -> int:
    row = NewRow(
        actor=run.request.actor,
        kind=RowKind.MESSAGE,
        body=_request_message(run.request.text, run.request.images),
    )
    rows = await in_thread(run.ledger.append, run.fence, [row], request=True)
    return rows[0].seq


async def _write_view(run: ClaimedRun, view: FollowupView) -> list[PreEntry]:
    """Write the view's copied messages as new rows of this run (original actors, the sources
    the view carries, ``extra.origin``); reused ones stay where they are. Returns the session
    file's messages, each with the ledger seq it stands for."""
    copies = [vm for vm in view.messages if vm.copied]
    written = iter(
        await in_thread(
            run.ledger.append,
            run.fence,
            [
                NewRow(
                    actor=vm.actor,
                    kind=RowKind.MESSAGE,
                    body=vm.message,
                    sources=vm.sources,
                    extra={"origin": vm.origin},
                )
                for vm in copies
            ],
        )
    )
    entries = []
    for vm in view.messages:
        seq = next(written).seq if vm.copied else (None if vm.synthetic else vm.origin)
        entries.append(PreEntry(message=vm.message, seq=seq))
    return entries


def make_mirror(
    run: ClaimedRun,
    *,
    offset: int,
    known: dict[str, int | None],
    request_seq: int,
    bus: EventBus | None,
    obligations: Obligations | None,
    nonce: str | None,
    session_file: FileId | None,
) -> Mirror:
    """The run's mirror: it writes only what pi announces over RPC (the harness's follower
    passes it every record), checks the checkpoint's proof with the run's ``nonce``, and reads
    only the ``session_file`` tether wrote (docs/security.md, "Rows only from pi")."""
    return Mirror(
        run.ledger,
        run.fence,
        session_file=run.run_dir / "session.jsonl",
        actors=run.actors,
        start_offset=offset,
        known=known,
        request=(run.request.text, request_seq),
        bus=bus,
        obligations=obligations,
        # Unconfined, no limit applies: a tool's MemoryError is the host's, not the run's.
        limits=LimitWatch() if run.agent.sandbox is SandboxKind.BWRAP else None,
        announced=Announced(),
        nonce=nonce,
        file_id=session_file,
    )


async def prepare(
    run: ClaimedRun,
    view: FollowupView | None,
    tools: ToolChannel,
    *,
    obligations: Obligations,
    clock: Clock,
    deadline: float,
    bus: EventBus,
    nonce: str,
) -> Prepared:
    """The run's rows (the view's copies, the request) and pi's session file, and what a
    harness taking the run over needs (docs/architecture.md#custody)."""
    entries = await _write_view(run, view) if view is not None else []
    if view is not None:
        obligations.add(view.sources)
    view_record = _view_record(view, sum(vm.copied for vm in view.messages)) if view else None
    request_seq = await _record_request(run)
    make_run_dir(run.config, run.fence.run)
    session_file = private_file(run.run_dir / "session.jsonl")
    offset, known = write_session_file(
        session_file, session_id=run.fence.run, cwd=run.workdir, messages=entries
    )
    written = file_id(session_file)  # pi is at its gate (or not started): no tool ran yet
    save_run_state(
        run.run_dir,
        CustodyState(
            offset=offset,
            known=known,
            request_seq=request_seq,
            deadline_at=time.time() + max(0.0, deadline - clock.now()),
            view=view_record,
            sources=sorted(obligations.sources),
            tools_token=tools.token,
            tools_path=str(tools.path),
            sandboxed=run.agent.sandbox is SandboxKind.BWRAP,
            nonce=nonce,
            session_file=written,
        ),
    )
    mirror = make_mirror(
        run,
        offset=offset,
        known=known,
        request_seq=request_seq,
        bus=bus,
        obligations=obligations,
        nonce=nonce,
        session_file=written,
    )
    return Prepared(mirror, view_record, offset)
