"""`tether eval continuation --scripted`: real pi runs through the harness against the package's
scripted model (deterministic; its summary is given and names none of the planted facts),
asserted from the JSON the command prints (DESIGN §3.13)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.eval import SUMMARY, make_workspace
from tether.ledger import RowKind, open_ledger
from tether.recall import read_range

pytestmark = pytest.mark.slow

BUDGET = 240_000


def _eval(tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    config = tmp_path / "tether.toml"
    # The provider is never reached (--scripted replaces it); the agent's deadline is kept.
    config.write_text(
        '[providers.hosted]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.auditor]\nprovider = "hosted"\nmodel = "m"\ndeadline_s = 600\n'
    )
    cmd = [sys.executable, "-m", "tether", "eval", "continuation", "--agent", "auditor"]
    cmd += ["--scripted", "--budget", str(BUDGET), "--dir", str(tmp_path / name)]
    cmd += ["--config", str(config), "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(done.stdout)
    assert record["problems"] == [], record["problems"]
    return record


def test_anchors_carry_the_identifiers_the_summary_loses(tmp_path: Path) -> None:
    on = _eval(tmp_path, "on", "--seeds", "5")
    assert on["seeds"] == 5
    assert on["budget"] == BUDGET
    assert on["checkpoints"] == [["written"]] * 5
    for key in ("revision", "pi_version", "provider", "model", "prompt_version"):
        assert on[key], key
    assert on["provider"] == "scripted"
    ids = on["identifiers"]
    assert ids["facts"] == 5 * 13
    assert ids["available"] >= 0.95, ids
    assert ids["by_part"]["anchors"] >= 0.95, ids
    # The summary itself carries none of them: what reaches the next view came from the rows.
    assert ids["by_part"]["summary"] == 0.0
    assert on["summary_identifiers"] == []
    assert on["bytes_by_part"]["anchors"] > 0
    assert on["view_bytes"] <= BUDGET
    # Probes: real follow-ups on copies of the session, scored by exact match.
    assert ids["answered_without_recall"] >= 0.95, ids
    assert on["recall_calls"]["without_recall"] == 0
    # Numbers are no identifiers: no anchor holds them, one named recall call returns them.
    numbers = on["kinds"]["number"]
    assert numbers["available"] == 0.0
    assert numbers["recoverable"] == 1.0
    assert numbers["answered_without_recall"] == 0.0
    assert numbers["answered_with_recall"] == 1.0
    assert on["recall_calls"]["with_recall"] > 0

    off = _eval(tmp_path, "off", "--seeds", "5", "--no-anchors", "--no-probes")
    assert off["anchors"] is False
    assert off["identifiers"]["facts"] == ids["facts"]
    # The same figure without anchors, lower: what the anchors add.
    assert off["identifiers"]["available"] < ids["available"]
    assert off["identifiers"]["by_part"]["anchors"] == 0.0
    assert off["bytes_by_part"].get("anchors", 0) == 0
    assert off["identifiers"]["answered_with_recall"] is None  # --no-probes


def test_decay_over_five_checkpoints_and_anchors_name_their_rows(tmp_path: Path) -> None:
    record = _eval(tmp_path, "decay", "--seeds", "1", "--runs", "5", "--no-probes")
    assert record["checkpoints"] == [["written"] * 5]
    decay = record["decay"]
    assert [d["checkpoint"] for d in decay] == [1, 2, 3, 4, 5]
    # Run 1's anchors travel into later checkpoints (the quoted anchors are carried forward).
    assert decay[-1]["identifiers_available"] >= 0.95, decay
    # The first run's decisions were in its request: the next previous request is another one.
    assert decay[0]["all_available"] > decay[1]["all_available"]

    # Every stored anchor names a covered row that holds its text, and the summary is the
    # scripted one.
    ledger = open_ledger(f"sqlite:{tmp_path / 'decay' / 'ledger.db'}")
    with ledger:
        comps = [r for r in ledger.iter_rows("eval-1") if r.kind is RowKind.COMPACTION]
        assert len(comps) == 5
        for comp in comps:
            assert comp.body["summary"] == SUMMARY
            items = comp.body["details"]["anchors"]["items"]
            assert items
            stored = json.dumps(items, separators=(",", ":"), ensure_ascii=False)
            assert len(stored.encode()) <= 8_000  # the bound (a seq is shorter than an entry id)
            for item in items:
                seq = item["seq"]
                assert 0 < seq <= comp.body["covers_to"]
                row = read_range(ledger, "eval-1", seq, seq, actor="user:eval", grants={})
                if item["kind"] != "command":
                    assert item["text"] in row.to_text(), item
                    continue
                # A command's row is its result (output and status); its call is the row
                # before it (the scripted agent makes one call per turn).
                assert row.rows[0].role == "toolResult", item
                if item["exit"]:
                    assert f"Command exited with code {item['exit']}" in row.rows[0].text
                call = read_range(ledger, "eval-1", seq - 1, seq - 1, actor="user:eval", grants={})
                assert item["text"] in call.to_text(), item
        ws = make_workspace(tmp_path / "again", 1, runs=5, budget=BUDGET)
        commands = {
            (a["text"], a.get("exit"))
            for a in comps[0].body["details"]["anchors"]["items"]
            if a["kind"] == "command"
        }
        for fact in ws.facts:
            if fact.kind.value == "command":
                assert (fact.needle, int(fact.answer)) in commands


def test_the_anchors_bound_keeps_the_newest(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text(
        '[providers.hosted]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.auditor]\nprovider = "hosted"\nmodel = "m"\nanchors_max_bytes = 600\n'
    )
    cmd = [sys.executable, "-m", "tether", "eval", "continuation", "--agent", "auditor"]
    cmd += ["--scripted", "--budget", "30000", "--dir", str(tmp_path / "small"), "--seeds", "1"]
    cmd += ["--no-probes", "--config", str(config), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout)
    assert record["anchors_max_bytes"] == 600
    # 600 bytes hold the newest anchors (the logs read last), not the facts read first.
    assert record["identifiers"]["available"] < 0.5
    with open_ledger(f"sqlite:{tmp_path / 'small' / 'ledger.db'}") as ledger:
        (comp,) = [r for r in ledger.iter_rows("eval-1") if r.kind is RowKind.COMPACTION]
        anchors = comp.body["details"]["anchors"]
        items = anchors["items"]
        assert items
        assert anchors["omitted"] > 0
        assert len(json.dumps(items, separators=(",", ":")).encode()) <= 600
        seqs = [a["seq"] for a in items]
        assert seqs == sorted(seqs, reverse=True)
        assert seqs[0] >= comp.body["covers_to"] - 2  # the newest rows of the run
