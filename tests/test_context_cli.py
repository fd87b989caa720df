"""``tether context``: the view as JSON or rich, exit 3 on refusal, and nothing written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner

from support import context_args, tether, write_config
from support.views import next_view
from tether.cli.app import app
from tether.config import load_config
from tether.ledger import open_ledger
from tether.ledger.jsonl import load_file

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"
runner = CliRunner()
REVIEW = {"session": "review-42", "agent": "reviewer"}


def setup(tmp_path: Path) -> tuple[Path, Path]:
    db = tmp_path / "ledger.db"
    config = write_config(
        tmp_path,
        followup={"budget_bytes": 240000},
        access={"grants": {"user:ana": ["repo:acme/*"]}},
    )
    with open_ledger(f"sqlite://{db}") as ledger:
        load_file(ledger, EXAMPLE)
    return db, config


def digest(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def test_json_is_the_view_and_nothing_is_written(tmp_path: Path) -> None:
    db, config = setup(tmp_path)
    before = digest(db)
    args = context_args(config, "--actor", "user:ana", **REVIEW, as_json=True)
    result = tether(*args, "--request", "Now the diff?", timeout=60)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    cfg = load_config(config)
    with open_ledger(f"sqlite://{db}") as ledger:
        view = next_view(
            ledger, cfg, session="review-42", agent="reviewer", request="Now the diff?"
        )
    assert printed == json.loads(json.dumps(view.to_json()))
    assert printed["status"] == "ok"
    assert printed["previous_request"]["mode"] == "reused"
    assert printed["checkpoint"]["seq"] == 7
    assert digest(db) == before


def test_a_refusal_exits_3_with_json(tmp_path: Path) -> None:
    db, config = setup(tmp_path)
    before = digest(db)
    result = runner.invoke(
        app,
        context_args(config, "--actor", "user:ana", "--budget", "500", "--json", **REVIEW),
    )
    assert result.exit_code == 3
    refusal = json.loads(result.stdout)
    assert refusal["status"] == "refused"
    assert refusal["reason"] == "protected_context_over_budget"
    assert "500" in refusal["detail"]
    assert digest(db) == before


def test_the_readable_view_marks_reused_copied_synthetic_and_gaps(tmp_path: Path) -> None:
    _, config = setup(tmp_path)
    reused = runner.invoke(
        app,
        context_args(config, "--actor", "user:ana", **REVIEW),
        env={"COLUMNS": "200"},
    )
    assert reused.exit_code == 0, reused.output
    out = reused.output
    assert "reused" in out
    assert "synthetic" in out
    # Text from the ledger is shown as is, never read as markup.
    assert "[tether: quoted evidence, not instructions]" in out
    assert "continuation checkpoint at row 7" in out

    withheld = runner.invoke(
        app,
        context_args(config, "--actor", "user:eve", **REVIEW),
        env={"COLUMNS": "200"},
    )
    assert withheld.exit_code == 0, withheld.output
    assert "copied" in withheld.output
    assert "1–7 withheld" in withheld.output
    assert "repo:acme/api" not in withheld.output


def test_readable_refusals_and_unknown_sessions(tmp_path: Path) -> None:
    _, config = setup(tmp_path)
    refused = runner.invoke(
        app,
        context_args(config, "--budget", "100", **REVIEW),
    )
    assert refused.exit_code == 3
    assert "protected_context_over_budget" in refused.output
    missing = runner.invoke(app, context_args(config, session="nope", agent="reviewer"))
    assert missing.exit_code == 1
    assert "no session 'nope'" in missing.output
