"""``tether recall`` and ``tether note``: the CLI twins of the tools, as JSON and for people."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from followup_sessions import RunWriter
from support import tether, write_config
from tether.cli.app import app
from tether.ledger import open_ledger

runner = CliRunner()


def setup(tmp_path: Path) -> Path:
    db = tmp_path / "ledger.db"
    config = write_config(tmp_path, access={"grants": {"user:ana": ["repo:acme/*"]}})
    with open_ledger(f"sqlite://{db}") as ledger:
        w = RunWriter.start(ledger, "review-42", "reviewer")
        w.request("Review the deploy")
        w.say("The canary host is falcon-7 in the eu pool.")
        w.say("The staging password hint: ocelot.", sources=("repo:acme/secrets",))
        w.say("Done for now.")
        w.end()
    return config


def test_recall_json_searches_for_the_actor(tmp_path: Path) -> None:
    config = setup(tmp_path)
    base = ["recall", "-s", "review-42", "--json", "--config", str(config)]
    ana = tether(*base, "--actor", "user:ana", "ocelot canary")
    assert ana.returncode == 0, ana.stderr
    found = json.loads(ana.stdout)
    assert found["mode"] == "search"
    assert {h["seq"] for h in found["hits"]} == {2, 3}
    assert all(set(h) == {"seq", "actor", "role", "snippet"} for h in found["hits"])
    assert found["withheld"] == []
    bob = json.loads(tether(*base, "--actor", "user:bob", "ocelot canary").stdout)
    assert [h["seq"] for h in bob["hits"]] == [2]
    assert bob["withheld"] == [{"from": 3, "to": 3}]
    assert "ocelot" not in json.dumps(bob["hits"])


def test_recall_json_reads_a_range(tmp_path: Path) -> None:
    config = setup(tmp_path)
    result = tether(
        "recall", "-s", "review-42", "--from", "2", "--to", "4", "--json", "--config", str(config)
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["mode"] == "range"
    assert [r["seq"] for r in found["rows"]] == [2, 4]
    assert found["rows"][0]["text"] == "The canary host is falcon-7 in the eu pool."
    assert found["withheld"] == [{"from": 3, "to": 3}]
    assert found["next"] is None


def test_recall_for_people_and_usage_errors(tmp_path: Path) -> None:
    config = setup(tmp_path)
    shown = runner.invoke(
        app, ["recall", "-s", "review-42", "--actor", "user:ana", "falcon", "-c", str(config)]
    )
    assert shown.exit_code == 0, shown.output
    assert "row 2 (assistant, by agent:reviewer)" in shown.output
    assert "> The canary host is falcon-7" in shown.output
    reversed_range = runner.invoke(
        app, ["recall", "-s", "review-42", "--from", "4", "--to", "2", "-c", str(config)]
    )
    assert reversed_range.exit_code == 2
    nothing = runner.invoke(app, ["recall", "-s", "review-42", "-c", str(config)])
    assert nothing.exit_code == 2


def test_note_add_and_list(tmp_path: Path) -> None:
    config = setup(tmp_path)
    added = tether(
        "note", "add", "-s", "review-42", "-a", "reviewer", "--actor", "user:ana",
        "Retry limit stays at 3.", "--config", str(config),
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    too_long = tether(
        "note", "add", "-s", "review-42", "-a", "reviewer", "x" * 2001, "--config", str(config)
    )
    assert too_long.returncode == 2
    assert "2000-byte limit" in too_long.stderr
    listed = tether(
        "note", "list", "-s", "review-42", "-a", "reviewer", "--json", "-c", str(config)
    )
    assert listed.returncode == 0, listed.stderr
    [note] = json.loads(listed.stdout)
    assert note["text"] == "Retry limit stays at 3."
    assert note["actor"] == "user:ana"
    assert (
        json.loads(
            tether(
                "note", "list", "-s", "review-42", "-a", "other", "--json", "-c", str(config)
            ).stdout
        )
        == []
    )
    context = tether(
        "context", "-s", "review-42", "-a", "reviewer", "--actor", "user:bob", "--json",
        "--config", str(config),
    )  # fmt: skip
    assert "> Retry limit stays at 3." in context.stdout
