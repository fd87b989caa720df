"""The continuation checkpoint, the harness's side (docs/contracts.md#compaction-rows, invariants
10–17).

After a successful task turn settles, :func:`continuation_checkpoint` (a ``CheckpointStep`` for
:func:`tether.harness.run.execute_run`; pi must load :data:`EXTENSION_PATH`):

1. measures pi's working view (``get_messages``, :func:`tether.sizes.measure`,
docs/contracts.md#byte-accounting);
   at or under ``followup.budget_bytes`` nothing more happens (``not_needed``);
2. above it, with at least ``checkpoint_min_time_s`` of the deadline left, no stop in progress
   and the continuation extension loaded, sends exactly one native ``compact`` whose custom
   instructions are the typed continuation marker, and no task prompt;
3. waits for the ``compact`` response while the client keeps reading pi's output (the mirror
   keeps mirroring, stops keep working: a soft stop or the deadline sends ``abort``, which aborts
   the summary, and pi answers both commands once it is idle; a hard stop kills pi);
4. on success, has the mirror write the compaction row (fenced) and checks it is in the ledger
   before returning (``written``);
5. on refusal, stores the extension's ``continuation_checkpoint_refused`` receipt as a receipt row
   of the run and records ``needs_recall`` on the run (``refused:<reason>``).

The authored answer is never touched here: it is the reply in every outcome. ``compact`` is sent
at most once per run and never replayed: if pi's idle cannot be confirmed by the deadline (plus
the stop grace), or pi goes away with the command in flight, the answer is kept and the session
refuses further prompts until an operator clears it.

When the harness itself refuses (no time left, a stop arrived, the extension is missing, pi did
not answer with a receipt), it writes the same receipt with the closest reason of the closed set:
``cancelled`` — the checkpoint was called off — and says why in the run's ``checkpoint_detail``;
the result names it as not tried, and why (``NotTried``: too little time left, a stop in
progress, no extension, pi unreachable), which the run's record keeps as its
``checkpoint_decision`` beside the label.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from tether import telemetry
from tether.config import AgentConfig, Config
from tether.errors import LedgerError
from tether.harness.stops import race_clock
from tether.harness.turn import (
    CheckpointResult,
    CheckpointStatus,
    NotTried,
    SettledTurn,
)
from tether.ledger import Fence, Ledger, ReceiptReason, Row, RowKind
from tether.mirror.mirror import Mirror
from tether.pi.agentdir import pi_settings
from tether.pi.client import Record, is_notify
from tether.pi.continuation import MARKER_TAG, MARKER_VERSION, PRESENCE_COMMAND, RECEIPT_KIND
from tether.pi.errors import TransportClosed
from tether.pi.install import extension_file
from tether.pi.protocol import Command, Response
from tether.sizes import measure
from tether.threads import in_thread

__all__ = [
    "EXTENSION_PATH",
    "MARKER_VERSION",
    "PRESENCE_COMMAND",
    "RECEIPT_KIND",
    "continuation_checkpoint",
    "marker",
    "parse_receipt",
    "retry_policy",
    "store_refusal",
    "view_bytes",
]

EXTENSION_PATH = extension_file("continuation")
"""The continuation extension, shipped inside the package, compiled (``pi -e PATH``)."""

# pi's own retry defaults (settings.md: retry.*), used for the summary call as pi uses them for
# its own summaries, unless the run's pi settings change them.
PI_RETRY_DEFAULTS = {
    "enabled": True,
    "maxRetries": 3,
    "baseDelayMs": 2000,
    "maxAgentDelayMs": 60000,
}


def view_bytes(messages: Sequence[Any]) -> int:
    """The size of a working view: its messages measured one by one
    (docs/contracts.md#byte-accounting)."""
    return sum(measure(m).text_bytes for m in messages)


def retry_policy(config: Config, agent: AgentConfig) -> dict[str, int] | None:
    """The summary call's retry policy: pi's ``retry`` settings of this run (None: disabled)."""
    settings = pi_settings(config, config.provider(agent.provider), agent)
    retry = {**PI_RETRY_DEFAULTS, **(settings.get("retry") or {})}
    if not retry.get("enabled", True):
        return None
    return {
        "max_retries": int(retry["maxRetries"]),
        "base_delay_ms": int(retry["baseDelayMs"]),
        "max_delay_ms": int(retry["maxAgentDelayMs"]),
    }


SUMMARY_SHARE = 4
"""A checkpoint's summary may take at most 1/SUMMARY_SHARE of the follow-up budget: the next view
must still hold it quoted, beside the previous request, the notes and the gap notices, or it is
refused (``protected_context_over_budget``) and the checkpoint was written for nothing."""


def summary_bound(agent: AgentConfig, budget: int) -> int:
    """The byte bound in the marker: the agent's ``summary_max_bytes``, capped by the budget."""
    return max(1, min(agent.summary_max_bytes, budget // SUMMARY_SHARE))


def anchors_bound(agent: AgentConfig, budget: int) -> int:
    """The anchors' byte bound in the marker: ``anchors_max_bytes``, whatever the budget. The
    next view quotes the newest that fit the room its rows leave and names the rest, so a
    smaller budget needs no smaller store."""
    del budget
    return agent.anchors_max_bytes


def marker(
    run: str, *, max_bytes: int, retry: dict[str, int] | None, anchors_max_bytes: int = 0
) -> str:
    """The ``compact`` custom instructions the extension recognises (and nothing else does)."""
    body: dict[str, Any] = {
        "tether": MARKER_TAG,
        "version": MARKER_VERSION,
        "run": run,
        "max_bytes": max_bytes,
    }
    if anchors_max_bytes > 0:  # absent: the extension stores no anchors
        body["anchors_max_bytes"] = anchors_max_bytes
    if retry is not None:
        body["retry"] = retry
    return json.dumps(body, separators=(",", ":"))


def parse_receipt(record: Record, run: str) -> ReceiptReason | None:
    """The reason of a refusal receipt for ``run``, if ``record`` is one (an error ``notify``)."""
    if not is_notify(record) or not isinstance(record, dict):
        return None
    if record.get("notifyType") != "error" or not isinstance(record.get("message"), str):
        return None
    try:
        body = json.loads(record["message"])
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("kind") != RECEIPT_KIND or body.get("run") != run:
        return None
    try:
        return ReceiptReason(str(body.get("reason")))
    except ValueError:
        return None


def _drain(records: MemoryObjectReceiveStream[Record], run: str) -> ReceiptReason | None:
    """The receipt among the records delivered so far. pi writes the notify before the
    ``compact`` response, and the client delivers records in order, so it is already here."""
    found: ReceiptReason | None = None
    while True:
        try:
            item = records.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return found
        found = parse_receipt(item, run) or found


async def store_refusal(
    mirror: Mirror, ledger: Ledger, fence: Fence, reason: ReceiptReason, detail: str | None
) -> None:
    """Store the refusal receipt as a row of the run and mark the run's context as needing
    recall (the straight path and a resumed one alike). Shielded: a stop arriving now must
    not leave the receipt without its run record."""
    body = {"kind": RECEIPT_KIND, "run": fence.run, "reason": reason.value}
    extra: dict[str, Any] = {"needs_recall": True}
    if detail:
        extra["checkpoint_detail"] = detail
    with anyio.CancelScope(shield=True):
        await mirror.append_receipt(body)
        await in_thread(ledger.update_run_extra, fence, extra)


async def _refuse(turn: SettledTurn, reason: ReceiptReason, detail: str | None) -> None:
    await store_refusal(turn.mirror, turn.ledger, turn.fence, reason, detail)


async def _compact(turn: SettledTurn, instructions: str) -> Response | TransportClosed:
    """The one ``compact`` of the run (never resent: invariant 16); a closed transport is a
    value here, so it does not leave the deadline race as an exception group."""
    try:
        return await turn.client.request(Command.COMPACT, customInstructions=instructions)
    except TransportClosed as exc:
        return exc


SUMMARY_STOPS = {
    ReceiptReason.TRUNCATED: "length",
    ReceiptReason.PROVIDER_FAILURE: "error",
    ReceiptReason.EMPTY: "stop",
    ReceiptReason.OVER_BOUND: "stop",
}
"""pi's stop reason of a summary call the extension refused for these reasons: the provider
answered (too long, or a summary refused for what it holds) or failed."""


def _summary_call(
    turn: SettledTurn,
    response: Response | TransportClosed | None,
    receipt: ReceiptReason | None,
    start_ns: int,
    end_ns: int,
) -> None:
    """What the trace shows of the summary's provider call (``facts["summary_call"]``): when it
    ended and how, and on success the tokens pi reports for it (``compact``'s ``usage``; none
    for a refused one). A summary cancelled (perhaps before any call) has no span."""
    if isinstance(response, Response) and response.success:
        data = response.data if isinstance(response.data, dict) else {}
        usage, stop = data.get("usage"), "stop"
    elif receipt in SUMMARY_STOPS:
        usage, stop = None, SUMMARY_STOPS[receipt]
    else:
        return
    turn.facts["summary_call"] = {
        "start_ns": start_ns,
        "end_ns": end_ns,
        "stop": stop,
        "usage": usage if isinstance(usage, dict) else None,
    }


async def _compact_or_abort(
    turn: SettledTurn, instructions: str
) -> Response | TransportClosed | None:
    """The ``compact`` answer, or None when pi answered the stop's ``abort`` first (it is
    idle then: whatever the compaction came to, pi has finished with it)."""
    found: list[Response | TransportClosed] = []
    async with anyio.create_task_group() as tg:

        async def compact() -> None:
            found.append(await _compact(turn, instructions))
            tg.cancel_scope.cancel()

        async def aborted() -> None:
            await turn.abort_answered.wait()
            # pi answers ``compact`` before it is idle, and the client delivers in order: a
            # response already here is taken.
            await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()

        tg.start_soon(compact)
        tg.start_soon(aborted)
    return found[0] if found else None


def _is_ours(row: Row | None, run: str) -> bool:
    if row is None or row.kind is not RowKind.COMPACTION:
        return False
    cont = row.body.get("continuation")
    return isinstance(cont, dict) and cont.get("run") == run and row.run == run


async def _await_row(turn: SettledTurn, bound: float) -> Row | None:
    """Have the mirror write pi's compaction entry (pi appends it before it answers) and find
    the row; poll briefly in case the mirror's own task holds the batch."""
    while True:
        await turn.mirror.sync()
        row: Row | None = await in_thread(turn.ledger.latest_compaction, turn.session)
        if _is_ours(row, turn.run_id):
            return row
        if turn.clock.now() >= bound:
            return None
        await anyio.sleep(0.05)


async def continuation_checkpoint(turn: SettledTurn) -> CheckpointResult:
    """The checkpoint step (see the module docstring). Ledger errors (a fenced-out writer)
    propagate: run.py ends the run as fenced out."""
    client, agent = turn.client, turn.agent
    budget = turn.config.followup.budget_bytes
    turn.facts.update(budget_bytes=budget, remaining_s=round(turn.remaining(), 3))
    try:
        messages = await client.call(Command.GET_MESSAGES)
        size = view_bytes(messages.get("messages") or [])
        turn.facts["view_bytes"] = size
        if size <= budget:
            return CheckpointResult.not_needed(NotTried.UNDER_BUDGET)
        commands = await client.call(Command.GET_COMMANDS)
    except TransportClosed as exc:
        await _refuse(turn, ReceiptReason.CANCELLED, f"pi went away before the checkpoint: {exc}")
        return CheckpointResult.skipped(NotTried.PI_UNREACHABLE)
    await in_thread(turn.ledger.update_run_extra, turn.fence, {"working_view_bytes": size})

    names = {c.get("name") for c in (commands.get("commands") or []) if isinstance(c, dict)}
    why_not: str | None = None
    skip = NotTried.STOP_IN_PROGRESS
    if turn.stop.requested:
        why_not = f"a stop ({turn.stop.reason}) was in progress"
    elif turn.remaining() < agent.checkpoint_min_time_s:
        skip = NotTried.TOO_LITTLE_TIME
        why_not = (
            f"only {turn.remaining():.1f}s of the deadline were left "
            f"(checkpoint_min_time_s = {agent.checkpoint_min_time_s:g})"
        )
    elif PRESENCE_COMMAND not in names:
        skip = NotTried.NO_EXTENSION
        why_not = (
            f"pi did not load the continuation extension ({EXTENSION_PATH}); pass it in "
            "RunRequest.extensions"
        )
    if why_not is not None:
        await _refuse(
            turn,
            ReceiptReason.CANCELLED,
            f"the working view ({size} bytes) is over "
            f"the budget ({budget}) but no checkpoint was attempted: {why_not}",
        )
        return CheckpointResult.skipped(skip)

    text = marker(
        turn.run_id,
        max_bytes=summary_bound(agent, budget),
        retry=retry_policy(turn.config, agent),
        anchors_max_bytes=anchors_bound(agent, budget),
    )
    bound = turn.deadline + turn.config.harness.stop_grace_s
    records = client.subscribe()
    # From here on a cut-off step counts as a refused checkpoint (run.py reads this).
    turn.attempt = CheckpointResult.refused(ReceiptReason.CANCELLED)
    sent, sent_ns = turn.clock.now(), telemetry.now_ns()
    try:
        with records:
            try:
                finished, response = await race_clock(
                    turn.clock, bound, lambda: _compact_or_abort(turn, text)
                )
                turn.facts["provider_ms"] = int((turn.clock.now() - sent) * 1000)
                answered_ns = telemetry.now_ns()
            except anyio.get_cancelled_exc_class():
                # A hard stop (or a fenced-out mirror) cancelled the step: pi is being killed,
                # and the run's final mirror pass reads pi's session file as pi left it.
                with anyio.CancelScope(shield=True), contextlib.suppress(LedgerError):
                    reason = _drain(records, turn.run_id) or ReceiptReason.CANCELLED
                    await _refuse(turn, reason, "the run was stopped during the checkpoint")
                    turn.attempt = CheckpointResult.refused(reason)
                raise
            receipt = _drain(records, turn.run_id)
    finally:
        records.close()
    _summary_call(turn, response, receipt, sent_ns, answered_ns)

    if isinstance(response, TransportClosed):
        reason = receipt or ReceiptReason.CANCELLED
        if turn.stop.hard:
            await _refuse(turn, reason, "the run was stopped during the checkpoint")
            return CheckpointResult.refused(reason)
        await _refuse(turn, reason, f"pi went away during the checkpoint: {response}")
        return CheckpointResult.refused(
            reason,
            f"pi went away while run {turn.run_id}'s continuation checkpoint was in flight; "
            "its delivery is unknown",
        )

    if finished and response is None:
        # pi answered the abort: it is idle, and the summary was called off.
        reason = receipt or ReceiptReason.CANCELLED
        await _refuse(turn, reason, None if receipt else "the summary was aborted by a stop")
        return CheckpointResult.refused(reason)
    if not finished or response is None:
        reason = receipt or ReceiptReason.CANCELLED
        await _refuse(turn, reason, "pi did not answer the checkpoint by the deadline")
        return CheckpointResult.refused(
            reason,
            f"pi's idle was not confirmed by the deadline of run {turn.run_id} during its "
            "continuation checkpoint",
        )
    if not response.success:
        reason = receipt or ReceiptReason.CANCELLED
        detail = None if receipt else f"pi refused the compaction: {response.error}"
        await _refuse(turn, reason, detail)
        return CheckpointResult.refused(reason)

    row = await _await_row(turn, turn.clock.now() + turn.config.harness.stop_grace_s)
    if row is None:
        # pi wrote the checkpoint but the mirror cannot show it: never claim it, and stop
        # prompts until someone looks (the final mirror pass may still write it).
        await in_thread(
            turn.ledger.update_run_extra,
            turn.fence,
            {"needs_recall": True, "checkpoint_detail": "the checkpoint row was not mirrored"},
        )
        return CheckpointResult.refused(
            ReceiptReason.CANCELLED,
            f"run {turn.run_id}'s continuation checkpoint was written by pi but not mirrored",
        )
    await in_thread(
        turn.ledger.update_run_extra,
        turn.fence,
        {"checkpoint_seq": row.seq, "needs_recall": False},
    )
    summary = row.body.get("summary")
    if isinstance(summary, str):
        turn.facts["summary_bytes"] = len(summary.encode())
    return CheckpointResult(CheckpointStatus.WRITTEN)
