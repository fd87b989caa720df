"""`tether eval continuation --scripted`: real pi runs through the harness against the package's
scripted model (deterministic; its summary is given and names none of the planted facts),
asserted from the JSON the command prints (docs/cli.md#tether-eval-continuation)."""

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


def _eval(tmp_path: Path, name: str, *args: str, budget: int = BUDGET) -> dict[str, Any]:
    config = tmp_path / "tether.toml"
    # The provider is never reached (--scripted replaces it); the agent's deadline is kept.
    config.write_text(
        '[providers.hosted]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.auditor]\nprovider = "hosted"\nmodel = "m"\ndeadline_s = 600\n'
    )
    cmd = [sys.executable, "-m", "tether", "eval", "continuation", "--agent", "auditor"]
    cmd += ["--scripted", "--budget", str(budget), "--dir", str(tmp_path / name)]
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
    # Measured values: the lines of tool output holding a number with its unit are anchors.
    numbers = on["kinds"]["number"]
    assert numbers["available"] >= 0.9, numbers
    assert numbers["by_part"]["anchors"] >= 0.9, numbers
    assert numbers["answered_without_recall"] >= 0.9, numbers
    # The user's decisions reach the next view as what people said, not only as the request.
    decisions = on["kinds"]["decision"]
    assert decisions["available_without_request"] >= 0.95, decisions
    assert on["all"]["seen"] == 1.0

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
    # The first run's decisions were in its request: what people said travels in the anchors
    # when the next previous request is another one.
    assert decay[-1]["all_available"] >= 0.95, decay

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


@pytest.mark.parametrize("budget", [16_000, 64_000, 240_000])
def test_the_targets_hold_at_each_budget(tmp_path: Path, budget: int) -> None:
    """Identifiers ≥ 95 % available, measured values ≥ 90 %, the user's decisions ≥ 95 %
    without counting the previous request, and after 5 checkpoints identifiers ≥ 90 %."""
    args = ("--seeds", "2", "--runs", "5", "--no-probes")
    record = _eval(tmp_path, f"b{budget}", *args, budget=budget)
    assert record["budget"] == budget
    assert record["anchors_max_bytes"] == 8_000  # stored whatever the budget
    assert record["checkpoints"] == [["written"] * 5] * 2
    assert record["identifiers"]["available"] >= 0.95, record["identifiers"]
    assert record["kinds"]["number"]["available"] >= 0.9, record["kinds"]["number"]
    decisions = record["kinds"]["decision"]
    assert decisions["available_without_request"] >= 0.95, decisions
    assert record["decay"][4]["identifiers_available"] >= 0.9, record["decay"]
    assert record["view_bytes"] <= budget


def test_any_budget_gives_a_record(tmp_path: Path) -> None:
    """A budget so small that the probe is over a quarter of it: the probes are scored
    refusals, named among the problems; the record still comes, with the effective anchors
    bound, and the probes' follow-ups write no checkpoint of their own."""
    config = tmp_path / "tether.toml"
    config.write_text(
        '[providers.hosted]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.auditor]\nprovider = "hosted"\nmodel = "m"\nanchors_max_bytes = 1000\n'
    )
    cmd = [sys.executable, "-m", "tether", "eval", "continuation", "--agent", "auditor"]
    cmd += ["--scripted", "--budget", "5000", "--dir", str(tmp_path / "tiny"), "--seeds", "1"]
    cmd += ["--config", str(config), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout)
    assert record["anchors_max_bytes"] == 1000
    refused = [p for p in record["problems"] if "request_too_large" in p]
    assert len(refused) == 2, record["problems"]
    assert record["all"]["answered_without_recall"] == 0.0
    assert record["all"]["answered_with_recall"] == 0.0
    assert record["all"]["seen"] == 1.0
    assert all(f["seen"] for f in record["seed_results"][0]["facts"])


def test_probes_write_no_checkpoint_of_their_own(tmp_path: Path) -> None:
    _eval(tmp_path, "probes", "--seeds", "1")
    with open_ledger(f"sqlite:{tmp_path / 'probes' / 'ledger.db'}") as ledger:
        for session in ("eval-1", "eval-1-without-recall", "eval-1-with-recall"):
            rows = list(ledger.iter_rows(session))
            assert [r.kind for r in rows].count(RowKind.COMPACTION) == 1, session
            assert not [r for r in rows if r.kind is RowKind.RECEIPT], session


def _echoes(tmp_path: Path, name: str, keep: int | None) -> tuple[str, str, Any]:
    """A run of 25 tiny tool calls at an 8,000-byte budget: its working view is far over the
    budget in bytes of JSON, while pi's estimate of its content is a few hundred tokens."""
    import anyio

    from tether.config import load_config
    from tether.eval.continuation import EvalOptions, _run, eval_config, nothing_to_compact
    from tether.eval.scripted import ScriptedModel
    from tether.eval.workspace import Step

    root = tmp_path / name
    (root / "ws").mkdir(parents=True)
    harness = "" if keep is None else f"[harness]\nkeep_recent_tokens = {keep}\n"
    toml = tmp_path / f"{name}.toml"
    toml.write_text(
        '[providers.hosted]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.auditor]\nprovider = "hosted"\nmodel = "m"\ndeadline_s = 600\n' + harness
    )
    plan = [Step("bash", {"command": f"echo {i}"}) for i in range(25)]
    with ScriptedModel([plan]) as model:
        options = EvalOptions(agent="auditor", scripted=True, budget=8000, directory=root)
        cfg = eval_config(load_config(toml), options, root, model.url)
        ledger = open_ledger(cfg.ledger.url)
        with ledger:
            out = anyio.run(_run, ledger, cfg, "auditor", "s1", "[eval run 1] echo", root / "ws")
            run = ledger.run(out.run)
            assert run is not None
            detail = str(run.extra.get("checkpoint_detail"))
            why = nothing_to_compact(ledger, cfg, "auditor", "s1", out.run)
    return out.checkpoint.label, detail, why


def test_pis_nothing_to_compact_is_named_precisely(tmp_path: Path) -> None:
    label, detail, why = _echoes(tmp_path, "default", None)
    assert label == "refused:cancelled"
    assert detail == "pi refused the compaction: Nothing to compact (session too small)"
    assert "under compaction.keepRecentTokens = 500" in why, why
    # The per-run setting is what decides it: with keepRecentTokens 1 the same run's due
    # checkpoint is written.
    label, _, _ = _echoes(tmp_path, "keep1", 1)
    assert label == "written"
