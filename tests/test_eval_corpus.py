"""`tether eval continuation --corpus DIR`: real pi session files with their facts files, scored
available / recoverable with no model; the example corpus in tests/data/eval-corpus was made from
a session the scripted evaluation creates (as the slow test here makes one again)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.eval.corpus import corpus_from_eval, read_facts
from tether.eval.workspace import make_workspace
from tether.ledger import open_ledger

# The anchors are taken by tether's extension code, run in pi's Node (tether.eval.corpus).
pytestmark = pytest.mark.pi

EXAMPLE = Path(__file__).resolve().parent / "data" / "eval-corpus"


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "tether.toml"
    config.write_text(
        '[providers.hosted]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.auditor]\nprovider = "hosted"\nmodel = "m"\ndeadline_s = 600\n'
    )
    return config


def _corpus(tmp_path: Path, corpus: Path, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tether", "eval", "continuation", "--agent", "auditor"]
    cmd += ["--corpus", str(corpus), "--dir", str(tmp_path / "out"), "--config"]
    cmd += [str(_config(tmp_path)), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads(done.stdout)
    return record


def test_the_example_corpus_is_scored_with_no_model(tmp_path: Path) -> None:
    facts = read_facts(EXAMPLE / "scripted-seed1.facts.jsonl")
    assert len(facts) == 18
    record = _corpus(tmp_path, EXAMPLE, "--budget", "16000")
    assert record["eval"] == "continuation-corpus"
    assert record["problems"] == []
    assert record["facts"] == 18
    assert record["seen"] == 1.0
    assert record["available"] == 1.0
    (session,) = record["sessions"]
    assert session["anchors_bytes"] > 0
    assert session["view_bytes"] <= 16000
    # Without anchors the summary names none of them: each is recoverable, none available
    # but the decisions (in the previous request).
    off = _corpus(tmp_path, EXAMPLE, "--budget", "16000", "--no-anchors")
    assert off["available"] is not None
    assert off["available"] < 0.2, off
    assert off["available_or_recoverable"] == 1.0


def test_a_fact_whose_entry_does_not_hold_its_quote_is_named(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(EXAMPLE / "scripted-seed1.jsonl", corpus / "one.jsonl")
    lines = (EXAMPLE / "scripted-seed1.facts.jsonl").read_text().splitlines()
    wrong = json.loads(lines[0]) | {"entry": json.loads(lines[1])["entry"]}
    (corpus / "one.facts.jsonl").write_text(json.dumps(wrong) + "\n")
    record = _corpus(tmp_path, corpus, "--budget", "16000")
    assert record["seen"] == 0.0
    assert record["available"] is None  # nothing seen: nothing scored
    assert record["problems"] == [
        f"one.jsonl: fact {wrong['id']}: entry {wrong['entry']} does not hold it"
    ]


@pytest.mark.slow
def test_a_scripted_session_makes_a_corpus(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tether", "eval", "continuation", "--agent", "auditor"]
    cmd += ["--scripted", "--budget", "16000", "--dir", str(tmp_path / "ev"), "--seeds", "1"]
    cmd += ["--no-probes", "--config", str(_config(tmp_path)), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ws = make_workspace(tmp_path / "again", 1, runs=1, budget=16000)
    with open_ledger(f"sqlite:{tmp_path / 'ev' / 'ledger.db'}") as ledger:
        n = corpus_from_eval(ledger, "eval-1", ws.facts, tmp_path / "corpus", "seed1")
    assert n == len(ws.facts)
    record = _corpus(tmp_path, tmp_path / "corpus", "--budget", "16000")
    assert record["problems"] == []
    assert record["seen"] == 1.0
    assert record["available"] == 1.0
