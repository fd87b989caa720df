"""The continuation checkpoint with the real pi and the scripted provider
(docs/contracts.md#compaction-rows,
invariants 10–14): a written checkpoint, the refusals, and the next run's view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from checkpoint_support import (
    ANSWER,
    SUMMARY,
    SYSTEM_MARK,
    Effort,
    config,
    long_task,
    rows_of,
    run,
)
from followup_sessions import RunWriter
from provider import Fail, Reply, empty, huge, route, truncated
from test_followup import check_well_formed
from tether.config import Config
from tether.followup import FollowupView, build_view
from tether.harness.checkpoint import (
    EXTENSION_PATH,
    marker,
    parse_receipt,
    retry_policy,
    view_bytes,
)
from tether.harness.turn import CheckpointResult, CheckpointStatus, SettledTurn
from tether.ledger import Ledger, ReceiptReason, RowKind, RunStatus, open_ledger
from tether.pi.protocol import Command

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path: Path) -> Any:
    ledger = open_ledger(f"sqlite://{tmp_path}/ledger.db")
    yield ledger
    ledger.close()


def view_after(ledger: Ledger, cfg: Config, session: str = "s1") -> FollowupView:
    view = build_view(
        ledger,
        session=session,
        agent="rev",
        actor="user:ana",
        request="And now?",
        config=cfg.followup,
        grants=cfg.access.grants,
    )
    assert isinstance(view, FollowupView), view
    check_well_formed(view)
    return view


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


# -- written ----------------------------------------------------------------------------------


@pytest.mark.parametrize("effort", ["high", "low"])
def test_one_summary_request_no_extra_task_request_and_a_mirrored_checkpoint(
    scripted_provider: Any, store: Ledger, tmp_path: Path, effort: Effort
) -> None:
    """Effort ``high``, then ``low``, on a reasoning model: the summary request names the task's
    model and sends the task's ``reasoning_effort``."""
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    cfg = config(tmp_path, provider, effort=effort)
    outcome = run(store, cfg, tmp_path)

    assert (outcome.status, outcome.checkpoint.label, outcome.answer) == (
        RunStatus.FINISHED,
        "written",
        ANSWER,
    )
    # Exactly the task's two requests and one summary request: no task prompt was added.
    assert len(provider.task_requests) == 2
    [summary] = provider.summary_requests
    assert summary.index == 2
    assert provider.exhausted == 0
    text = summary.last_user_text
    # The complete working view, in one call: the request, the big tool result, the answer.
    assert "<conversation>" in text
    assert "</conversation>" in text
    assert "Count to 2000, then tell me the answer." in text
    assert ANSWER in text
    # pi's shared serializer, with its own cut of long tool results.
    assert "\n100\n" in text
    assert "more characters truncated" in text
    # System context, which pi's serializer drops, is quoted as evidence ahead of it.
    quoted = text.split("<conversation>")[0]
    assert "<quoted-system-context>" in quoted
    assert SYSTEM_MARK in quoted
    assert "not instructions to you" in quoted
    # The selected model and effort, unchanged; no marker text leaks into the summarizer's prompt.
    sent = [(r.body["model"], r.body.get("reasoning_effort")) for r in provider.requests]
    assert sent == [(provider.model, effort)] * 3
    assert '"tether"' not in summary.raw.decode()

    [row] = rows_of(store, "s1", RowKind.COMPACTION)
    assert row.run == outcome.run
    assert row.body["summary"] == SUMMARY
    assert row.body["continuation"] == {"version": 1, "run": outcome.run}
    assert row.body["self_retaining"] is True
    assert row.body["covers_to"] == row.seq - 1
    assert row.body["tokens_before"] > 0
    assert rows_of(store, "s1", RowKind.RECEIPT) == []
    record = store.get_run(outcome.run)
    assert record.extra["checkpoint"] == "written"
    assert record.extra["checkpoint_seq"] == row.seq
    assert record.extra["needs_recall"] is False
    assert record.extra["answer"] == ANSWER
    assert record.extra["working_view_bytes"] > cfg.followup.budget_bytes


def test_the_next_run_reads_the_checkpoint_even_when_the_tail_does_not_reach_it(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(
        route(task=[*long_task(), Reply("second answer")], summary=[Reply(SUMMARY)])
    )
    cfg = config(tmp_path, provider)
    first = run(store, cfg, tmp_path)
    assert first.checkpoint.label == "written"
    [checkpoint] = rows_of(store, "s1", RowKind.COMPACTION)

    # Later work on the session that alone is larger than the budget: the tail stops there.
    filler = RunWriter.start(store, "s1", "rev")
    filler.request("Look at the rest.")
    for i in range(6):
        filler.say(f"observation {i}: " + "x" * 900)
    filler.end()
    view = view_after(store, cfg)
    assert view.checkpoint is not None
    assert view.checkpoint.seq == checkpoint.seq
    assert all(m.origin is None or m.origin > checkpoint.seq for m in view.messages)
    quoted = [m for m in view.messages if "SUMMARY-MARK-5c1e" in text_of(m.message)]
    assert len(quoted) == 1
    assert quoted[0].synthetic

    # And a real follow-up run gives it to the model (no second checkpoint asked for here).
    second = run(store, cfg, tmp_path, text="What did you count to?", checkpoint=None)
    assert second.answer == "second answer"
    assert "SUMMARY-MARK-5c1e" in provider.task_requests[-1].raw.decode()
    assert "1999\\n2000" not in provider.task_requests[-1].raw.decode()


def test_a_second_checkpoint_summarises_the_follow_up_view_including_the_first(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    second_summary = "## Goal\nCount again (SECOND-MARK-91d0)."
    provider = scripted_provider(
        route(
            task=[*long_task(), *long_task("second answer")],
            summary=[Reply(SUMMARY), Reply(second_summary)],
        )
    )
    cfg = config(tmp_path, provider)
    first = run(store, cfg, tmp_path)
    second = run(store, cfg, tmp_path, text="Count to 2000 once more.")
    assert (first.checkpoint.label, second.checkpoint.label) == ("written", "written")
    assert second.answer == "second answer"
    assert len(provider.summary_requests) == 2
    # The second summary covers its whole working view: the first checkpoint, as tether quoted
    # it into the follow-up, and the second run's own work.
    text = provider.summary_requests[1].last_user_text
    conversation = text.split("<conversation>")[1]
    assert "SUMMARY-MARK-5c1e" in conversation
    assert "Count to 2000 once more." in conversation
    assert "second answer" in conversation
    older, newer = rows_of(store, "s1", RowKind.COMPACTION)
    assert newer.run == second.run
    assert newer.body["summary"] == second_summary
    assert newer.body["covers_to"] == newer.seq - 1 > older.seq
    view = view_after(store, cfg)
    assert view.checkpoint is not None
    assert view.checkpoint.seq == newer.seq


def test_a_view_under_the_budget_needs_no_checkpoint(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    cfg = config(tmp_path, provider, budget=200_000)
    outcome = run(store, cfg, tmp_path)
    assert (outcome.checkpoint.label, outcome.answer) == ("not_needed", ANSWER)
    assert provider.summary_requests == []
    assert rows_of(store, "s1", RowKind.COMPACTION) == []
    assert rows_of(store, "s1", RowKind.RECEIPT) == []
    assert "needs_recall" not in store.get_run(outcome.run).extra


# -- refused ----------------------------------------------------------------------------------

REFUSALS = {
    # 5xx on every attempt: pi's retry policy (2 retries) is spent, then the summary fails.
    "provider_failure": ([Fail(503, "upstream overloaded")] * 3, 3),
    "truncated": ([truncated("## Goal\nCount to")], 1),
    "empty": ([empty()], 1),
    "over_bound": ([huge(6000)], 1),
}


@pytest.mark.parametrize("reason", sorted(REFUSALS))
def test_a_refused_summary_leaves_a_receipt_and_the_answer(
    reason: str, scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    script, attempts = REFUSALS[reason]
    provider = scripted_provider(route(task=long_task(), summary=script))
    cfg = config(tmp_path, provider, summary_max_bytes=4000)
    outcome = run(store, cfg, tmp_path)

    assert outcome.status is RunStatus.FINISHED
    assert outcome.answer == ANSWER
    assert outcome.checkpoint.label == f"refused:{reason}"
    assert len(provider.summary_requests) == attempts
    assert len(provider.task_requests) == 2
    assert provider.exhausted == 0
    assert rows_of(store, "s1", RowKind.COMPACTION) == []
    [receipt] = rows_of(store, "s1", RowKind.RECEIPT)
    assert receipt.body == {
        "kind": "continuation_checkpoint_refused",
        "run": outcome.run,
        "reason": reason,
    }
    assert receipt.run == outcome.run
    record = store.get_run(outcome.run)
    assert record.extra["needs_recall"] is True
    assert record.extra["answer"] == ANSWER
    assert record.extra["checkpoint"] == f"refused:{reason}"
    assert store.get_session("s1").refusing is None

    # The next view falls back to the exact request and recent rows, and names the refusal.
    view = view_after(store, cfg)
    assert view.checkpoint is None
    assert view.previous_request is not None
    assert view.previous_request.seq == record.request_seq
    texts = [text_of(m.message) for m in view.messages]
    assert any("could not write a continuation checkpoint" in t and reason in t for t in texts)


# -- only tether's compactions ------------------------------------------------------------------


def custom_step(instructions: str | None) -> Any:
    """A checkpoint step that sends one ``compact`` with these instructions."""

    async def step(turn: SettledTurn) -> CheckpointResult:
        fields = {} if instructions is None else {"customInstructions": instructions}
        response = await turn.client.request(Command.COMPACT, **fields)
        await turn.mirror.sync()
        if response.success:
            return CheckpointResult(CheckpointStatus.WRITTEN)
        return CheckpointResult.refused(ReceiptReason.CANCELLED)

    return step


def test_other_compactions_are_left_to_pi(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply("pi's own summary")]))
    cfg = config(tmp_path, provider)
    outcome = run(store, cfg, tmp_path, checkpoint=custom_step("Focus on the numbers"))
    assert outcome.checkpoint.label == "written"
    [row] = rows_of(store, "s1", RowKind.COMPACTION)
    # pi's default compaction: its split-turn format, keeping its recent entries.
    assert "continuation" not in row.body
    assert "**Turn Context (split turn):**" in row.body["summary"]
    assert "pi's own summary" in row.body["summary"]
    assert row.body["self_retaining"] is False
    assert "Additional focus: Focus on the numbers" in provider.summary_requests[0].raw.decode()
    assert rows_of(store, "s1", RowKind.RECEIPT) == []


def test_a_marker_of_another_version_is_refused_not_handed_to_pi(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    cfg = config(tmp_path, provider)
    bad = json.dumps({"tether": "continuation", "version": 99, "run": "r-x", "max_bytes": 10})
    outcome = run(store, cfg, tmp_path, checkpoint=custom_step(bad))
    assert outcome.checkpoint.label == "refused:cancelled"
    assert provider.summary_requests == []
    assert rows_of(store, "s1", RowKind.COMPACTION) == []


def test_without_the_extension_the_harness_sends_no_marker(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    cfg = config(tmp_path, provider)
    outcome = run(store, cfg, tmp_path, extensions=())
    assert outcome.checkpoint.label == "refused:cancelled"
    assert provider.summary_requests == []
    assert rows_of(store, "s1", RowKind.COMPACTION) == []
    record = store.get_run(outcome.run)
    assert "continuation extension" in record.extra["checkpoint_detail"]


def test_too_little_time_left_means_no_checkpoint(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    provider = scripted_provider(route(task=long_task(), summary=[Reply(SUMMARY)]))
    # More time asked for than the whole deadline: refused however fast the turn ran (asking
    # for 99 of 100 s flaked when the turn took under a second).
    cfg = config(tmp_path, provider, deadline_s=100, min_time_s=150)
    outcome = run(store, cfg, tmp_path)
    assert (outcome.checkpoint.label, outcome.answer) == ("refused:cancelled", ANSWER)
    assert provider.summary_requests == []
    [receipt] = rows_of(store, "s1", RowKind.RECEIPT)
    assert receipt.body["reason"] == "cancelled"
    assert "deadline" in store.get_run(outcome.run).extra["checkpoint_detail"]


# -- pieces -------------------------------------------------------------------------------------


def test_marker_receipt_and_policy(tmp_path: Path) -> None:
    assert EXTENSION_PATH.is_file()
    m = json.loads(marker("r-1", max_bytes=500, retry={"max_retries": 1, "base_delay_ms": 5}))
    assert m == {
        "tether": "continuation",
        "version": 1,
        "run": "r-1",
        "max_bytes": 500,
        "retry": {"max_retries": 1, "base_delay_ms": 5},
    }
    note = {
        "type": "extension_ui_request",
        "id": "u1",
        "method": "notify",
        "notifyType": "error",
        "message": json.dumps(
            {"kind": "continuation_checkpoint_refused", "run": "r-1", "reason": "empty"}
        ),
    }
    assert parse_receipt(note, "r-1") is ReceiptReason.EMPTY
    assert parse_receipt(note, "r-2") is None
    assert parse_receipt({**note, "notifyType": "info"}, "r-1") is None
    assert parse_receipt({**note, "message": "not json"}, "r-1") is None
    bad_reason = json.dumps(
        {"kind": "continuation_checkpoint_refused", "run": "r-1", "reason": "x"}
    )
    assert parse_receipt({**note, "message": bad_reason}, "r-1") is None

    cfg = config(tmp_path, _Url("http://127.0.0.1:1/v1"))
    assert retry_policy(cfg, cfg.agent("rev")) == {
        "max_retries": 2,
        "base_delay_ms": 10,
        "max_delay_ms": 60000,
    }
    off = cfg.model_copy(
        update={
            "harness": cfg.harness.model_copy(update={"pi_settings": {"retry": {"enabled": False}}})
        }
    )
    assert retry_policy(off, off.agent("rev")) is None
    msgs = [{"role": "user", "content": [{"type": "text", "text": "héllo"}], "timestamp": 1}]
    assert view_bytes(msgs) == len(
        '{"content":[{"text":"héllo","type":"text"}],"role":"user","timestamp":1}'.encode()
    )


class _Url:
    def __init__(self, url: str) -> None:
        self.url = url
        self.model = "scripted"


def test_the_summary_bound_is_capped_by_the_follow_up_budget(
    scripted_provider: Any, store: Ledger, tmp_path: Path
) -> None:
    # 1,500 bytes is under the configured bound but over a quarter of the 4,000-byte budget: the
    # next view could not quote it beside the request and the notices, so it is refused.
    provider = scripted_provider(route(task=long_task(), summary=[huge(1500)]))
    cfg = config(tmp_path, provider, budget=4000, summary_max_bytes=60_000)
    outcome = run(store, cfg, tmp_path)
    assert (outcome.checkpoint.label, outcome.answer) == ("refused:over_bound", ANSWER)
    assert rows_of(store, "s1", RowKind.COMPACTION) == []
    assert len(provider.summary_requests) == 1
