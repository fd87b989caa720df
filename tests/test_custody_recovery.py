"""The recovery paths keep custody's promises (docs/architecture.md#custody, invariants 14-16): a
takeover's old
harness, a missing FIFO found at recovery, a dead keeper, a checkpoint a lost harness sent. The
real pi under its keeper, the scripted provider, real signals (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from provider import Reply, ScriptedProvider, Stall, Step, ToolCall, route
from support.config import workspace_tree
from test_custody_run import (
    by_request,
    descendants_with,
    keeper_placement,
    lose_everything,
    run_placed,
    running_run,
    start,
    store,
    tether,
    wait_until,
    write_config,
)
from tether.config import load_config
from tether.followup import FollowupView, build_view
from tether.ledger import Ledger, RowKind, RunStatus
from tether.mirror.entries import message_text

__all__ = ["store"]  # the fixture, shared with test_custody_run


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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
    old = start(tmp_path, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "A")
    try:
        wait_until(lambda: running_run(store, "s1"), what="the run")
        run = running_run(store, "s1")
        assert run is not None
        keeper_placement(store, run.id)
        wait_until(in_tool.exists, what="the bash tool to run")
        old.send_signal(signal.SIGSTOP)
        wait_until(lambda: store.expired_leases(session="s1"), within=20, what="the lease to lapse")
        done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
        assert done.returncode == 0, done.stderr
        [item] = [json.loads(line) for line in done.stdout.splitlines()]
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


def _refusing(store: Ledger, session: str) -> str | None:
    return store.get_session(session).refusing


def test_pi_and_its_keeper_killed_mid_summary_end_the_run_within_seconds(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """An unrecoverable checkpoint transport: pi and its keeper are SIGKILLed while the
    summary is being made. The FIFO reader finds the keeper gone (by pid and start time) and
    the run ends at once, not at its deadline (120 s): the answer kept, the checkpoint refused,
    the session refusing."""
    provider = scripted_provider(
        route(task=by_request(lambda asked: "seq 1 3000"), summary=[Stall()])
    )
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

    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
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


def test_a_resumed_checkpoints_refusal_is_stored_with_its_true_reason(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness dies during the summary, which then comes back truncated: the run taken
    over stores pi's refusal as a receipt row with its true reason (``truncated``, not
    ``cancelled``) and records that context may require recall, as the straight path does."""
    provider = scripted_provider(
        route(
            task=by_request(lambda asked: "seq 1 3000"),
            summary=[Reply("a summary cut by the tok", finish="length", delay_s=3)],
        )
    )
    cfg, run_id, _ = _kill_harness_in_summary(tmp_path, provider, store)
    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
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
    provider = scripted_provider(
        route(
            task=by_request(lambda asked: "seq 1 3000"),
            summary=[Reply("## Goal\nSUMMARY-AFTER-FIFO", delay_s=3)],
        )
    )
    cfg, run_id, placed = _kill_harness_in_summary(tmp_path, provider, store)
    (tmp_path / "runs" / run_id / "commands.fifo").unlink()
    assert psutil.Process(placed["pi_pid"]).is_running()
    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
    assert item["resolution"] == "resumed", item
    assert item["outcome"]["answer"] == "answer to A"
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


def notice_of_tried_checkpoint(store: Ledger, cfg: Path, run_id: str) -> str:
    """The next follow-up view's notice that ``run_id``'s checkpoint was tried and refused."""
    loaded = load_config(cfg)
    view = build_view(
        store,
        session="s1",
        agent="rev",
        actor="user:local",
        request="And now?",
        config=loaded.followup,
        grants=loaded.access.grants,
    )
    assert isinstance(view, FollowupView), view
    said = json.dumps(view.to_json())
    notice = f"Run {run_id} could not write a continuation checkpoint (cancelled)"
    assert notice in said, said[:2000]
    return notice


def test_a_host_crash_mid_summary_is_recorded_as_a_tried_checkpoint_at_recovery(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], store: Ledger
) -> None:
    """The harness, pi and its keeper SIGKILLed together while pi makes the summary (a host's
    crash): ``tether recover`` ends the run ``harness_lost`` with its answer, and records that a
    checkpoint was tried and how it ended (refused, ``cancelled``), a receipt row, and that
    context may require recall; the next view's notice says so."""
    provider = scripted_provider(
        route(task=by_request(lambda asked: "seq 1 3000"), summary=[Stall()])
    )
    cfg = write_config(tmp_path, provider.url, budget=4000, deadline_s=120)
    proc, run, placed = run_placed(tmp_path, cfg, store)
    try:
        wait_until(lambda: provider.summary_requests, within=90, what="the summary request")
        assert (tmp_path / "runs" / run.id / "compact.sent").exists()
    finally:
        lose_everything(proc, placed)
    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
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
    provider = scripted_provider(
        route(task=by_request(lambda asked: "seq 1 3000"), summary=[Stall()])
    )
    cfg, run_id, placed = _kill_harness_in_summary(tmp_path, provider, store, deadline_s=25)
    done = tether(tmp_path, "recover", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    [item] = [json.loads(line) for line in done.stdout.splitlines()]
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
