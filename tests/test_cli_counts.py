"""What the CLI prints of a session: ``tether log --json`` holds the run records the human form
shows (status, stop reason, checkpoint decision, limits hit), and every count reads right for
one and for many ("1 session", "2 sessions")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tether.cli.app import app
from tether.cli.counts import counted, counts
from tether.interop import export_pi
from tether.ledger import Ledger, NewRow, RunStatus, open_ledger
from tether.ledger.jsonl import dump_session

runner = CliRunner()


def msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}


def one_run(ledger: Ledger, sid: str, *, extra: dict[str, Any] | None = None) -> str:
    ledger.ensure_session(sid)
    fence = ledger.claim_run(ledger.create_run(sid, "rev").id)
    ledger.append(fence, [NewRow.message("user:ana", msg("user", "go"))], request=True)
    ledger.end_run(fence, RunStatus.FINISHED, extra=extra)
    return fence.run


def said(result: Any) -> str:
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_log_json_holds_the_run_records(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/l.db"
    hit = {"limit": "file_size", "tool": "bash", "seq": 1, "evidence": "EFBIG"}
    with open_ledger(url) as store:
        done = one_run(
            store,
            "s",
            extra={
                "stop_reason": "soft_stop",
                "checkpoint": "refused:empty",
                "checkpoint_decision": {"decision": "refused", "reason": "empty"},
                "limits_hit": [hit],
                "answer": "it is done",
            },
        )
        queued = store.create_run("s", "rev").id
    log = runner.invoke(app, ["log", "-s", "s", "--json", "--ledger", url])
    assert log.exit_code == 0, log.output
    records = [json.loads(line) for line in log.stdout.splitlines()]
    assert [r["type"] for r in records] == ["run", "run", "row"]
    first, second = records[0], records[1]
    assert (first["id"], first["status"], first["request_seq"]) == (done, "finished", 1)
    assert first["stop_reason"] == "soft_stop"
    assert first["checkpoint"] == "refused:empty"
    assert first["checkpoint_decision"] == {"decision": "refused", "reason": "empty"}
    assert first["limits_hit"] == [hit]
    assert first["answer"] == "it is done"  # the rest of the record, as `ledger dump` has it
    assert first["ended"] is not None
    # a run that has not ended yet: the same keys, null
    assert (second["id"], second["status"]) == (queued, "queued")
    assert {k: second[k] for k in ("stop_reason", "checkpoint_decision", "limits_hit")} == {
        "stop_reason": None,
        "checkpoint_decision": None,
        "limits_hit": None,
    }
    human = said(runner.invoke(app, ["log", "-s", "s", "--ledger", url]))
    assert f"run {done}: rev finished (soft_stop), request seq 1" in human
    assert "checkpoint refused (empty)" in human
    assert "limits hit: file_size (bash at seq 1)" in human


def test_counts_read_right_for_one_and_for_many(tmp_path: Path) -> None:
    assert counted(1, "session") == "1 session"
    assert counted(0, "session") == "0 sessions"
    assert counted(3, "pi entry") == "3 pi entries"
    assert counted(1, "run directory") == "1 run directory"
    assert counted(12_000, "byte", thousands=True) == "12,000 bytes"
    assert counts((1, "row"), (2, "note")) == "1 row, 2 notes"

    one, two = f"sqlite://{tmp_path}/one.db", f"sqlite://{tmp_path}/two.db"
    with open_ledger(one) as store:
        one_run(store, "s")
        store.add_note("s", "rev", "a note")
        dumped = tmp_path / "s.jsonl"
        with dumped.open("w") as out:
            dump_session(store, "s", out)
        exported = tmp_path / "s.pi.jsonl"
        with exported.open("w") as out:
            export_pi(store, "s", out)
    assert "copied 1 session, 1 run, 1 row, 1 note" in said(
        runner.invoke(app, ["ledger", "copy", one, two])
    )
    loaded = said(runner.invoke(app, ["ledger", "load", str(dumped), "--ledger", "memory:"]))
    assert "loaded 1 session, 1 run, 1 row, 1 note from" in loaded
    assert "session s (1 row, 1 run)" in said(
        runner.invoke(app, ["log", "-s", "s", "--ledger", two])
    )
    imported = said(
        runner.invoke(app, ["import", "pi", str(exported), "-s", "t", "-a", "rev", "--ledger", two])
    )
    assert "imported 1 row in 1 run into session t (0 compactions" in imported
    assert "0 bookkeeping entries kept) from 2 entries of" in imported  # the row and its run
    out = tmp_path / "t.jsonl"
    exporting = said(
        runner.invoke(app, ["export", "pi", "-s", "t", "-o", str(out), "--ledger", two])
    )
    assert "exported 1 row and 1 run of session t as 2 pi entries" in exporting
    assert "not in the file: 0 runs not ended, sources of 0 rows, 0 notes" in exporting


def test_an_erasure_and_retention_count_right(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/l.db"
    cfg = tmp_path / "tether.toml"
    cfg.write_text(
        f'[ledger]\nurl = "{url}"\n[retention]\nidle_days = 1\n'
        f'[harness]\nruns_dir = "{tmp_path}/runs"\nworkspaces_dir = "{tmp_path}/ws"\n'
    )
    with open_ledger(url) as store:
        store.ensure_session("s")
        fence = store.claim_run(store.create_run("s", "rev").id)
        store.append(fence, [NewRow.message("user:ana", msg("user", "go"))], request=True)
        answer = NewRow.message("agent:rev", msg("assistant", "x"), sources=("repo:x",))
        store.append(fence, [answer])
        store.end_run(fence, RunStatus.FINISHED)
    erased = said(runner.invoke(app, ["erase", "--source", "repo:x", "--config", str(cfg)]))
    assert "erased source repo:x: 1 row, 1 run scrubbed (receipt" in erased
    idle = runner.invoke(app, ["retention", "apply", "--dry-run", "--config", str(cfg)])
    assert "no session idle for 1 day" in said(idle)
