"""The recovery paths keep custody's promises (docs/architecture.md#custody, invariants 14-16): a
takeover's old
harness, a missing FIFO found at recovery, a dead keeper, a checkpoint a lost harness sent. The
real pi under its keeper, the scripted provider, real signals (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from provider import Reply, Script, ScriptedProvider, Stall, Step, ToolCall, route
from support.cli import run_args
from support.config import workspace_tree
from support.views import next_view
from support.wait import wait_for_async
from test_custody_run import (
    by_request,
    descendants_with,
    keeper_placement,
    lose_everything,
    recovered,
    run_placed,
    running_run,
    start,
    store,
    tether,
    wait_until,
    write_config,
)
from tether.clock import ManualClock
from tether.config import load_config
from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint
from tether.harness.run import RunOutcome, RunRequest, execute_run
from tether.harness.stops import StopControl, StopReason
from tether.ledger import Ledger, RowKind, Run, RunStatus
from tether.mirror.entries import message_text
from tether.processes import start_time

__all__ = ["store"]  # the fixture, shared with test_custody_run


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _over_budget(
    scripted_provider: Callable[..., ScriptedProvider], summary: Script
) -> ScriptedProvider:
    """A provider whose task turn (``seq 1 3000``, then ``answer to A``) leaves a working view
    over a 4,000-byte budget, and whose summary requests ``summary`` answers."""
    return scripted_provider(route(task=by_request(lambda asked: "seq 1 3000"), summary=summary))


def _noticed_soon(predicate: Callable[[], object], *, what: str, said: str) -> None:
    """Wait for ``predicate`` (what a lost keeper leads to) and assert it came within 10 s of
    now (the kill), not at the run's deadline; the time taken is printed after ``said``."""
    killed = time.monotonic()
    wait_until(predicate, within=110, what=what)
    took = time.monotonic() - killed
    print(f"{said} in {took:.2f} s")
    assert took <= 10, f"the lost keeper was noticed after {took:.1f} s"


def test_the_old_harness_says_it_was_taken_over_and_exits_5(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness stops (SIGSTOP) past its lease; ``tether recover`` takes the run over and
    finishes it on the same pi. Continued, the old ``tether run`` does not report the run as
    failed: it names the takeover and the new owner, prints the run's status in the ledger
    now, and exits 5 (docs/cli.md)."""
    in_tool = workspace_tree(tmp_path) / "in-tool"  # the session's: the sandboxed tool writes it
    provider = scripted_provider(by_request(lambda asked: f"touch {in_tool}; sleep 4; echo slept"))
    cfg = write_config(tmp_path, provider.url, lease_s=2)
    old = start(tmp_path, *run_args(cfg, "A", as_json=True))
    try:
        wait_until(lambda: running_run(store, "s1"), what="the run")
        run = running_run(store, "s1")
        assert run is not None
        keeper_placement(store, run.id)
        wait_until(in_tool.exists, what="the bash tool to run")
        old.send_signal(signal.SIGSTOP)
        wait_until(lambda: store.expired_leases(session="s1"), within=20, what="the lease to lapse")
        item = recovered(tmp_path, cfg)
        assert item["resolution"] == "resumed"
        assert item["outcome"]["status"] == "finished"
        ended = store.get_run(run.id)
        assert ended.status is RunStatus.FINISHED
        assert ended.extra["answer"] == "answer to A"
    finally:
        old.send_signal(signal.SIGCONT)
    out, err = old.communicate(timeout=60)
    assert old.returncode == 5, (old.returncode, out, err)
    said = json.loads(out)
    assert said["taken_over"] is True
    assert said["status"] == "finished", said  # the ledger's, not this process's "failed"
    assert "taken over by a newer owner" in err
    assert "owner " in said["error"]
    # The new owner's end stands: the old harness wrote nothing over it.
    again = store.get_run(run.id)
    assert again.status is RunStatus.FINISHED
    assert again.extra["answer"] == "answer to A"
    assert again.epoch == ended.epoch


def _pi_answered(run_dir: Path) -> list[str]:
    """The commands pi answered in its run (its responses, in the run directory's events)."""
    lines = (run_dir / "events.jsonl").read_bytes().split(b"\n")
    return [json.loads(line).get("command") for line in lines if b'"response"' in line]


TAKEN_OVER_SUMMARY = "## Goal\nSUMMARY-AFTER-TAKEOVER"


def _summary_once_released(
    scripted_provider: Callable[..., ScriptedProvider],
) -> tuple[ScriptedProvider, threading.Event]:
    """A provider whose task turn ends over a 4,000-byte budget and whose summary answers only
    once the returned event is set (the test's takeover and stops come first)."""
    release = threading.Event()

    def summary(req: Any) -> Step:
        release.wait(120)
        return Reply(TAKEN_OVER_SUMMARY)

    return _over_budget(scripted_provider, summary), release


def _beats_for(store: Ledger, run_id: str, pid: int) -> Callable[[], bool]:
    """Whether the run's lease now names the harness ``pid`` (its owner's heartbeat)."""

    def beats() -> bool:
        lease = store.lease(run_id)
        return lease is not None and (lease.placement or {}).get("harness_pid") == pid

    return beats


def _assert_untouched(placed: dict[str, Any], run_dir: Path) -> None:
    """The same pi (pid and start time) still runs, answered no ``abort``, and no exit record
    was written for it."""
    assert not _gone(placed["pi_pid"]), "the old harness ended the new owner's pi"
    assert start_time(placed["pi_pid"]) == placed["pi_start"]
    assert "abort" not in _pi_answered(run_dir)
    assert not (run_dir / "exit.json").exists()


def _assert_the_new_owner_finished(
    store: Ledger, provider: ScriptedProvider, run: Run, placed: dict[str, Any], recovered: str
) -> None:
    """``tether recover`` (its stdout ``recovered``) resumed the run and pi answered it: the
    compaction the old harness asked for is the checkpoint, written once and mirrored by the
    new owner, and pi was ended in order."""
    [item] = [json.loads(line) for line in recovered.splitlines()]
    assert item["resolution"] == "resumed", item
    assert (item["outcome"]["answer"], item["outcome"]["checkpoint"]) == ("answer to A", "written")
    ended = store.get_run(run.id)
    assert ended.status is RunStatus.FINISHED
    assert ended.epoch == run.epoch + 1
    assert ended.extra["checkpoint_by"] == "original"
    [row] = [r for r in store.iter_rows("s1") if r.kind is RowKind.COMPACTION]
    assert row.body["summary"] == TAKEN_OVER_SUMMARY
    assert (row.run, ended.extra["checkpoint_seq"]) == (run.id, row.seq)
    assert _receipts(store, run.id) == []
    assert len(provider.summary_requests) == 1
    assert store.get_session("s1").refusing is None
    assert ended.extra["pi"]["exit_status"] == 0, "pi was ended by its owner, in order"
    assert _gone(placed["pi_pid"])


def test_tether_run_stopped_after_a_takeover_mid_summary_leaves_the_new_owners_pi_alone(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The task turn settled and pi makes the summary; ``tether run`` is frozen (SIGSTOP) past
    its lease and a second harness (``tether recover``) takes the run over and waits on the
    same pi's compaction. The old harness gets two stop signals (a soft stop, then a hard one
    that kills pi) and is thawed: whichever it sees first, its stops or its lost lease, it
    exits 5 naming the takeover and leaves pi alone; pi then answers the new owner, which
    mirrors the checkpoint (docs/architecture.md#custody, invariant 16)."""
    provider, release = _summary_once_released(scripted_provider)
    cfg = write_config(tmp_path, provider.url, budget=4000, lease_s=2)
    old, run, placed = run_placed(tmp_path, cfg, store)
    new = None
    try:
        wait_until(lambda: provider.summary_requests, within=90, what="the summary request")
        old.send_signal(signal.SIGSTOP)
        wait_until(lambda: store.expired_leases(session="s1"), within=20, what="the lease to lapse")
        new = start(tmp_path, "recover", "--config", str(cfg), "--json")
        wait_until(_beats_for(store, run.id, new.pid), what="the new owner's heartbeat")
        for sig in (signal.SIGTERM, signal.SIGINT):  # pending until the old harness thaws
            old.send_signal(sig)
        old.send_signal(signal.SIGCONT)
        out, err = old.communicate(timeout=60)
        assert old.returncode == 5, (old.returncode, out, err)
        assert json.loads(out)["taken_over"] is True
        assert "taken over by a newer owner" in err
        _assert_untouched(placed, tmp_path / "runs" / run.id)
        release.set()
        recovered, recover_err = new.communicate(timeout=90)
    finally:
        release.set()
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate(timeout=10)
    assert new.returncode == 0, recover_err
    _assert_the_new_owner_finished(store, provider, run, placed, recovered)


@pytest.mark.parametrize("hard", [False, True], ids=["soft_stop", "hard_stop"])
def test_a_stop_reaching_the_old_harness_mid_summary_after_a_takeover_leaves_pi_alone(
    tmp_path: Path,
    scripted_provider: Callable[..., ScriptedProvider],
    store: Ledger,
    hard: bool,
) -> None:
    """As above, with the stop landing before the old harness knows of the takeover: its
    clock never moves, so it beats once and its lease lapses, and only the stop makes it ask
    who owns the run. A soft stop would send ``abort`` (ending the new owner's summary), a
    hard one would kill pi: both find the newer owner first and leave pi to it."""
    provider, release = _summary_once_released(scripted_provider)
    cfg = write_config(tmp_path, provider.url, budget=4000, lease_s=2)
    request = RunRequest(session="s1", agent="rev", text="A", extensions=(EXTENSION_PATH,))
    new: list[subprocess.Popen[str]] = []

    async def old_harness() -> tuple[RunOutcome, Run, dict[str, Any]]:
        stop, found = StopControl(), []
        async with anyio.create_task_group() as tg:

            async def execute() -> None:
                ran = execute_run(
                    store,
                    load_config(cfg),
                    request,
                    checkpoint=continuation_checkpoint,
                    stop=stop,
                    clock=ManualClock(),
                )
                found.append(await ran)

            tg.start_soon(execute)
            await wait_for_async(lambda: provider.summary_requests, 90, "the summary request")
            [run] = store.live_runs(session="s1")
            placed = keeper_placement(store, run.id)
            await wait_for_async(lambda: store.expired_leases(session="s1"), 20, "no lease")
            new.append(start(tmp_path, "recover", "--config", str(cfg), "--json"))
            await wait_for_async(_beats_for(store, run.id, new[0].pid), 60, "the new owner")
            if hard:
                stop.stop_hard()
            else:
                stop.soft()
            # Promptly: its stop, not pi's answer or the new owner's deadline, ends it.
            await wait_for_async(lambda: found, 20, "the old harness to end after its stop")
        return found[0], run, placed

    try:
        outcome, run, placed = anyio.run(old_harness)
        assert outcome.stop_reason is StopReason.FENCED_OUT, outcome
        assert "newer owner" in (outcome.error or "")
        _assert_untouched(placed, outcome.run_dir)
        release.set()
        recovered, recover_err = new[0].communicate(timeout=90)
    finally:
        release.set()
        for proc in new:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    assert new[0].returncode == 0, recover_err
    _assert_the_new_owner_finished(store, provider, run, placed, recovered)


def _refusing(store: Ledger, session: str) -> str | None:
    return store.get_session(session).refusing


def test_pi_and_its_keeper_killed_mid_summary_end_the_run_within_seconds(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """An unrecoverable checkpoint transport: pi and its keeper are SIGKILLed while the
    summary is being made. The FIFO reader finds the keeper gone (by pid and start time) and
    the run ends at once, not at its deadline (120 s): the answer kept, the checkpoint refused,
    the session refusing."""
    provider = _over_budget(scripted_provider, [Stall()])
    cfg = write_config(tmp_path, provider.url, budget=4000, deadline_s=120)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    try:
        wait_until(lambda: provider.summary_requests, within=90, what="the summary request")
        os.killpg(placed["pi_pid"], signal.SIGKILL)
        os.kill(placed["keeper_pid"], signal.SIGKILL)
        _noticed_soon(
            lambda: (
                store.get_run(run.id).status is not RunStatus.RUNNING
                and _refusing(store, "s1") is not None
            ),
            what="the run to end and the session to refuse",
            said="pi and keeper killed mid-summary: run ended, session refusing",
        )
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(out)
    assert result["answer"] == "answer to A", err
    assert result["checkpoint"] == "refused:cancelled"
    ended = store.get_run(run.id)
    assert ended.extra["answer"] == "answer to A"
    refusing = _refusing(store, "s1")
    assert refusing is not None
    assert run.id in refusing
    answers = [r for r in store.iter_rows("s1") if r.role == "assistant" and r.run == run.id]
    assert message_text(answers[-1].body) == "answer to A"


def test_a_keeper_killed_during_a_tool_ends_the_run_with_its_answer_and_no_tool_left(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """Only the keeper dies, during a bash tool that started a process in a session of its
    own: the run ends within seconds (not at its deadline), its answer is pi's last answer row
    in the ledger, the session refuses prompts, and no process of the tool is left."""
    marker = f"tether-keeper-lost-{os.getpid()}-{time.monotonic_ns()}"
    command = f"setsid sh -c 'sleep 300; : {marker}' & sh -c 'sleep 300; : {marker}-fg'"

    def script(req: Any) -> Step:
        last = req.messages[-1] if req.messages else {}
        if last.get("role") == "tool":
            return Reply("answer to A")
        return Reply("looking at the tree", tool_calls=[ToolCall("bash", {"command": command})])

    provider = scripted_provider(script)
    cfg = write_config(tmp_path, provider.url, deadline_s=120)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    try:
        wait_until(lambda: len(descendants_with(marker)) >= 2, what="the tool processes")
        os.kill(placed["keeper_pid"], signal.SIGKILL)
        _noticed_soon(
            lambda: store.get_run(run.id).status is not RunStatus.RUNNING,
            what="the run to end",
            said="keeper killed during a tool: run ended",
        )
        out, err = proc.communicate(timeout=30)
        wait_until(lambda: not descendants_with(marker), within=5, what="the tool to end")
    finally:
        if proc.poll() is None:
            proc.kill()
        for left in descendants_with(marker):
            left.kill()
    ended = store.get_run(run.id)
    mine = [r for r in store.iter_rows("s1") if r.role == "assistant" and r.run == run.id]
    said = [message_text(r.body) for r in mine if message_text(r.body).strip()]
    assert said, "pi's answer rows were mirrored"
    last = said[-1]
    assert ended.extra["answer"] == last, (ended.extra, err)
    assert json.loads(out)["answer"] == last
    refusing = _refusing(store, "s1")
    assert refusing is not None
    assert "keeper" in refusing
    assert _gone(placed["pi_pid"])


def test_a_fifo_lost_mid_tool_found_at_recovery_keeps_the_answer_sends_no_compact_and_refuses(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness is SIGKILLed mid-tool and pi's command FIFO is removed; pi lives on and
    answers. The placement is confirmed (this host, pi by pid and start time), so recovery
    follows pi to its end without a channel to it: the answer is mirrored from pi's session
    file before pi is ended, it is the run's answer, no checkpoint is attempted, and the
    session refuses prompts (docs/architecture.md#custody: a missing FIFO disables the checkpoint
    and further
    prompts without discarding the completed answer)."""
    in_tool = workspace_tree(tmp_path) / "in-tool"  # the session's: the sandboxed tool writes it
    provider = scripted_provider(
        route(
            task=by_request(lambda asked: f"touch {in_tool}; sleep 2; seq 1 3000"),
            summary=[Reply("never asked")],
        )
    )
    cfg = write_config(tmp_path, provider.url, budget=4000)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    wait_until(in_tool.exists, what="the bash tool to run")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    (tmp_path / "runs" / run.id / "commands.fifo").unlink()
    assert psutil.Process(placed["pi_pid"]).is_running()

    item = recovered(tmp_path, cfg)
    assert item["resolution"] != "unconfirmed_ending", item  # the placement was confirmed
    ended = store.get_run(run.id)
    assert ended.status is RunStatus.FINISHED, ended.extra
    assert ended.extra["answer"] == "answer to A"
    assert ended.extra["stop_reason"] != "unconfirmed_ending"
    answers = [
        r for r in store.iter_rows("s1") if r.role == "assistant" and "answer to A" in str(r.body)
    ]
    assert len(answers) == 1
    assert provider.summary_requests == []
    refusing = store.get_session("s1").refusing
    assert refusing is not None
    assert "FIFO" in refusing
    assert _gone(placed["pi_pid"])


def _receipts(store: Ledger, run_id: str) -> list[dict[str, Any]]:
    return [r.body for r in store.iter_rows("s1") if r.kind is RowKind.RECEIPT and r.run == run_id]


def _kill_harness_in_summary(
    tmp_path: Path, provider: ScriptedProvider, store: Ledger, **config: Any
) -> tuple[Path, str, dict[str, Any]]:
    """``tether run`` until pi asks for the summary, then SIGKILL the harness (pi and its keeper
    live on, the ``compact`` delivered)."""
    cfg = write_config(tmp_path, provider.url, budget=4000, **config)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    try:
        wait_until(lambda: provider.summary_requests, within=90, what="the summary request")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    assert (tmp_path / "runs" / run.id / "compact.sent").exists()
    return cfg, run.id, placed


def _fifo_lost_in_summary(
    tmp_path: Path, provider: ScriptedProvider, store: Ledger, **config: Any
) -> tuple[Path, str, dict[str, Any], dict[str, Any]]:
    """:func:`_kill_harness_in_summary`, then pi's command FIFO removed (pi still runs) and
    ``tether recover``, which resumes the run on that pi and keeps its answer: the config,
    the run, pi's placement and recover's record of the run."""
    cfg, run_id, placed = _kill_harness_in_summary(tmp_path, provider, store, **config)
    (tmp_path / "runs" / run_id / "commands.fifo").unlink()
    assert psutil.Process(placed["pi_pid"]).is_running()
    item = recovered(tmp_path, cfg)
    assert item["resolution"] == "resumed", item
    assert item["outcome"]["answer"] == "answer to A"
    return cfg, run_id, placed, item


def test_a_resumed_checkpoints_refusal_is_stored_with_its_true_reason(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness dies during the summary, which then comes back truncated: the run taken
    over stores pi's refusal as a receipt row with its true reason (``truncated``, not
    ``cancelled``) and records that context may require recall, as the straight path does."""
    provider = _over_budget(
        scripted_provider, [Reply("a summary cut by the tok", finish="length", delay_s=3)]
    )
    cfg, run_id, _ = _kill_harness_in_summary(tmp_path, provider, store)
    item = recovered(tmp_path, cfg)
    assert item["resolution"] == "resumed"
    assert item["outcome"]["checkpoint"] == "refused:truncated", item
    assert item["outcome"]["answer"] == "answer to A"
    ended = store.get_run(run_id)
    assert ended.extra["checkpoint"] == "refused:truncated"
    assert ended.extra["needs_recall"] is True
    [receipt] = _receipts(store, run_id)
    assert receipt == {
        "kind": "continuation_checkpoint_refused",
        "run": run_id,
        "reason": "truncated",
    }
    assert store.get_session("s1").refusing is None  # pi answered: its idle is confirmed
    assert len(provider.summary_requests) == 1  # the summary command was never sent again


def test_a_fifo_lost_after_compact_sent_is_found_at_recovery_its_compact_awaited_not_resent(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness is SIGKILLed while pi makes the summary (``compact.sent`` written) and pi's
    command FIFO is then removed: recovery resumes the run on its pi without a channel to it,
    awaits the compaction already sent (never sent again), keeps the answer, and the session
    refuses prompts."""
    provider = _over_budget(scripted_provider, [Reply("## Goal\nSUMMARY-AFTER-FIFO", delay_s=3)])
    _, run_id, placed, item = _fifo_lost_in_summary(tmp_path, provider, store)
    ended = store.get_run(run_id)
    assert ended.extra["answer"] == "answer to A"
    # The summary pi was already making is the checkpoint: awaited, never sent again.
    assert item["outcome"]["checkpoint"] == "written", item
    assert ended.extra["checkpoint_by"] == "original"
    [row] = [r for r in store.iter_rows("s1") if r.kind is RowKind.COMPACTION]
    assert row.body["summary"] == "## Goal\nSUMMARY-AFTER-FIFO"
    assert ended.extra["checkpoint_seq"] == row.seq
    assert len(provider.summary_requests) == 1
    refusing = store.get_session("s1").refusing
    assert refusing is not None
    assert "FIFO" in refusing
    assert _gone(placed["pi_pid"])


@pytest.mark.parametrize(
    ("summary", "reason", "refusal"),
    [
        (Reply("", finish="stop", delay_s=3), "empty", "command FIFO of run {run} is missing"),
        (Stall(), "cancelled", "sent by a lost harness and its outcome is unknown"),
    ],
    ids=["refused_summary", "unanswered_summary"],
)
def test_a_fifo_lost_after_compact_sent_and_no_checkpoint_keeps_the_answer_and_refuses(
    tmp_path: Path,
    scripted_provider: Callable[..., ScriptedProvider],
    store: Ledger,
    summary: Step,
    reason: str,
    refusal: str,
) -> None:
    """As above, but the summary pi was making is no checkpoint: empty (pi refuses it and
    answers the compaction), or never coming (at the deadline no ``abort`` can reach pi
    without its FIFO, so its answer is unknown). Either way recovery keeps the answer, writes
    no compaction row, records the tried checkpoint (the run's ``checkpoint``, a receipt row
    with its reason, ``needs_recall``), never sends the summary command again, ends pi, and
    the session refuses prompts (exit 3) until cleared; the next view's notice then names the
    tried checkpoint."""
    provider = _over_budget(scripted_provider, [summary])
    cfg, run_id, placed, item = _fifo_lost_in_summary(tmp_path, provider, store, deadline_s=25)
    assert item["outcome"]["checkpoint"] == f"refused:{reason}", item
    ended = store.get_run(run_id)
    assert (ended.status, ended.extra["answer"]) == (RunStatus.FINISHED, "answer to A")
    assert ended.extra["checkpoint_decision"] == {"decision": "refused", "reason": reason}
    assert ended.extra["needs_recall"] is True
    assert [r for r in store.iter_rows("s1") if r.kind is RowKind.COMPACTION] == []
    [receipt] = _receipts(store, run_id)
    assert receipt == {"kind": "continuation_checkpoint_refused", "run": run_id, "reason": reason}
    assert len(provider.summary_requests) == 1
    assert _gone(placed["pi_pid"])
    refusing = store.get_session("s1").refusing
    assert refusing is not None
    assert refusal.format(run=run_id) in refusing
    nxt = tether(tmp_path, *run_args(cfg, "B", as_json=True))
    assert nxt.returncode == 3, nxt.stderr
    assert json.loads(nxt.stdout)["reason"] == "session_refusing"
    assert len(provider.task_requests) == 2, "the refused request reached no model"
    # Once an operator clears the session, the next view names the checkpoint tried.
    cleared = tether(tmp_path, "session", "clear", "s1", "--config", str(cfg))
    assert cleared.returncode == 0, cleared.stderr
    notice_of_tried_checkpoint(store, cfg, run_id, reason)


def notice_of_tried_checkpoint(
    store: Ledger, cfg: Path, run_id: str, reason: str = "cancelled"
) -> str:
    """The next follow-up view's notice that ``run_id``'s checkpoint was tried and refused
    (for ``reason``)."""
    view = next_view(store, load_config(cfg), actor="user:local")
    said = json.dumps(view.to_json())
    notice = f"Run {run_id} could not write a continuation checkpoint ({reason})"
    assert notice in said, said[:2000]
    return notice


def test_a_host_crash_mid_summary_is_recorded_as_a_tried_checkpoint_at_recovery(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness, pi and its keeper SIGKILLed together while pi makes the summary (a host's
    crash): ``tether recover`` ends the run ``harness_lost`` with its answer, and records that a
    checkpoint was tried and how it ended (refused, ``cancelled``), a receipt row, and that
    context may require recall; the next view's notice says so."""
    provider = _over_budget(scripted_provider, [Stall()])
    cfg = write_config(tmp_path, provider.url, budget=4000, deadline_s=120)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    try:
        wait_until(lambda: provider.summary_requests, within=90, what="the summary request")
        assert (tmp_path / "runs" / run.id / "compact.sent").exists()
    finally:
        lose_everything(proc, placed)
    item = recovered(tmp_path, cfg)
    assert item["resolution"] == "harness_lost", item
    ended = store.get_run(run.id)
    assert ended.status is RunStatus.INTERRUPTED
    assert ended.extra["answer"] == "answer to A"
    assert ended.extra["checkpoint"] == "refused:cancelled", ended.extra
    assert ended.extra["checkpoint_decision"] == {"decision": "refused", "reason": "cancelled"}
    assert "lost" in ended.extra["checkpoint_detail"]
    assert ended.extra["needs_recall"] is True
    [receipt] = _receipts(store, run.id)
    assert receipt == {
        "kind": "continuation_checkpoint_refused",
        "run": run.id,
        "reason": "cancelled",
    }
    notice_of_tried_checkpoint(store, cfg, run.id)
    assert len(provider.summary_requests) == 1


def test_a_resumed_checkpoint_at_the_deadline_is_aborted_and_the_compactions_answer_awaited(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness dies during a summary that never comes; the run taken over reaches its
    deadline: it sends ``abort`` (a new command, not the summary again) and waits for the
    original compaction's answer or the abort's. pi answers the compaction (aborted), and the
    record says that answer, not the abort's, came: its idle is confirmed, the refusal is
    stored, the answer kept, pi ends in order and the session does not refuse."""
    provider = _over_budget(scripted_provider, [Stall()])
    cfg, run_id, placed = _kill_harness_in_summary(tmp_path, provider, store, deadline_s=25)
    item = recovered(tmp_path, cfg)
    assert item["resolution"] == "resumed"
    assert item["outcome"]["answer"] == "answer to A"
    assert item["outcome"]["checkpoint"] == "refused:cancelled", item
    assert store.get_session("s1").refusing is None, store.get_session("s1").refusing
    [receipt] = _receipts(store, run_id)
    assert receipt["reason"] == "cancelled"
    ended = store.get_run(run_id)
    assert ended.extra["needs_recall"] is True
    # pi answered the summary's own ``compact`` (with the abort's error): that answer, not the
    # ``abort`` command's, ended the wait.
    assert ended.extra["checkpoint_answered_by"] == "compaction", ended.extra
    assert ended.extra["stop_reason"] == "deadline"  # the stop that aborted the summary
    assert ended.extra["pi"]["exit_status"] == 0, "pi was idle and ended in order"
    assert len(provider.summary_requests) == 1
    assert _gone(placed["pi_pid"])
