"""The checkpoint decision without OpenTelemetry: what a run's record keeps
(``extra.checkpoint_decision``) is shown by ``tether log`` on the run's line and by the session
page on the run's header (and its JSON twin). The real runs that write it are in
tests/test_telemetry.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from support.service import service_config, text_message
from tether.config import load_config
from tether.harness.turn import (
    NOT_NEEDED,
    CheckpointResult,
    CheckpointStatus,
    NotTried,
    decision_text,
)
from tether.ledger import NewRow, ReceiptReason, RunStatus, open_ledger
from tether.service.app import create_app

DETAIL = "only 3.0s of the deadline were left (checkpoint_min_time_s = 30)"


def test_the_decision_of_each_result() -> None:
    cases = {
        CheckpointResult(CheckpointStatus.WRITTEN): ("written", None),
        NOT_NEEDED: ("not_tried", "under_budget"),
        CheckpointResult.not_needed(NotTried.TURN_NOT_SUCCESSFUL): (
            "not_tried",
            "turn_not_successful",
        ),
        CheckpointResult.skipped(NotTried.TOO_LITTLE_TIME): ("not_tried", "too_little_time"),
        CheckpointResult.refused(ReceiptReason.EMPTY): ("refused", "empty"),
    }
    got = {result: tuple(result.record().values()) for result in cases}
    assert got == cases
    # The label stays as it always was.
    assert CheckpointResult.skipped(NotTried.STOP_IN_PROGRESS).label == "refused:cancelled"
    assert CheckpointResult.not_needed(NotTried.NO_STEP).label == "not_needed"
    assert decision_text({}) is None
    assert decision_text({"checkpoint_decision": {"decision": "written", "reason": None}}) == (
        "written"
    )


def test_tether_log_and_the_session_page_show_the_decision(tmp_path: Path) -> None:
    config = service_config(
        tmp_path, grants={"user:ana": ["repo:acme/*"]}, tokens={"ana-token": "user:ana"}
    )
    cfg = load_config(config)
    with open_ledger(cfg.ledger.url) as ledger:
        ledger.ensure_session("s1")
        run = ledger.create_run("s1", "rev", extra={"request": {"actor": "user:ana"}})
        fence = ledger.claim_run(run.id)
        ledger.append(
            fence, [NewRow.message("user:ana", text_message("user", "hello"))], request=True
        )
        ledger.append(fence, [NewRow.message("agent:rev", text_message("assistant", "hi"))])
        skipped = CheckpointResult.skipped(NotTried.TOO_LITTLE_TIME)
        ledger.end_run(
            fence,
            RunStatus.FINISHED,
            extra={
                "answer": "hi",
                "checkpoint": skipped.label,
                "checkpoint_decision": skipped.record(),
                "checkpoint_detail": DETAIL,
            },
        )
        with TestClient(create_app(cfg, ledger)) as c:
            auth = {"Authorization": "Bearer ana-token"}
            twin = c.get("/sessions/s1.json", headers=auth).json()
            header = twin["runs"][run.id]
            assert (header["checkpoint_decision"], header["checkpoint_reason"]) == (
                "not_tried",
                "too_little_time",
            )
            page = c.get("/sessions/s1", headers=auth).text
            assert "checkpoint not tried (too little time)" in page

    shown = subprocess.run(
        [sys.executable, "-m", "tether", "log", "-s", "s1", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith(f"run {run.id}")]
    assert f"checkpoint not tried (too little time): {DETAIL}" in " ".join(shown.stdout.split())
    assert "finished" in line
