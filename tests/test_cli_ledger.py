"""The ledger commands, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from support import one_line_error, tether, write_config
from tether.cli.app import app

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"
runner = CliRunner()


def test_load_dump_log_sessions_through_the_entry_point(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/l.db"
    loaded = tether("ledger", "load", str(EXAMPLE), "--ledger", url)
    assert loaded.returncode == 0, loaded.stderr
    assert "11 rows" in loaded.stdout

    dumped = tether("ledger", "dump", "--session", "review-42", "--ledger", url)
    assert dumped.returncode == 0
    original = [json.loads(x) for x in EXAMPLE.read_text().split("\n") if x]
    assert [json.loads(x) for x in dumped.stdout.split("\n") if x] == original

    listed = tether("sessions", "--json", "--ledger", url)
    assert json.loads(listed.stdout) == {
        "id": "review-42",
        "created": "2026-11-29T10:00:00Z",
        "rows": 11,
        "refusing": None,
    }

    log = tether("log", "--session", "review-42", "--json", "--ledger", url)
    records = [json.loads(x) for x in log.stdout.split("\n") if x]
    runs = [r for r in records if r["type"] == "run"]
    assert [r["status"] for r in runs] == ["finished", "finished"]
    assert all(r["usage"] is None for r in runs)  # loaded runs carry none
    rows = [r for r in records if r["type"] == "row"]
    assert [r["seq"] for r in rows] == list(range(1, 12))
    assert "compaction" in rows[6]


def test_bad_file_exits_non_zero_names_line_and_writes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/l.db"
    bad = tmp_path / "bad.jsonl"
    lines = EXAMPLE.read_text().split("\n")
    lines[4] = "{not json"
    bad.write_text("\n".join(lines))
    result = runner.invoke(app, ["ledger", "load", str(bad), "--ledger", url])
    assert result.exit_code == 2  # bad input is a usage error (docs/cli.md#tether-run)
    assert f"{bad}:5: malformed JSON" in result.output
    assert "nothing was written" in result.output
    listed = runner.invoke(app, ["sessions", "--json", "--ledger", url])
    assert listed.output == ""


def test_unknown_session_and_bad_url_are_clear_errors(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["log", "--session", "ghost", "--ledger", f"sqlite:{tmp_path}/l.db"]
    )
    assert result.exit_code == 1
    assert "no session 'ghost'" in result.output
    result = runner.invoke(app, ["sessions", "--ledger", "mysql://x"])
    assert result.exit_code == 2  # a configuration error
    assert "unknown ledger URL" in result.output


def test_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "tether.toml"
    cfg.write_text("[ledger]\nurll = 'memory:'\n")
    result = runner.invoke(app, ["sessions", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "ledger.urll" in result.output


def test_session_clear(tmp_path: Path) -> None:
    from tether.ledger import open_ledger

    url = f"sqlite:{tmp_path}/l.db"
    with open_ledger(url) as ledger:
        ledger.create_session("s1")
        ledger.set_refusing("s1", "pi idle unconfirmed")
    result = runner.invoke(app, ["session", "clear", "s1", "--ledger", url])
    assert result.exit_code == 0
    with open_ledger(url) as ledger:
        assert ledger.get_session("s1").refusing is None


def _commands(group: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out += _commands(cmd, f"{prefix}{name} ")
        else:
            out.append((f"{prefix}{name}", cmd))
    return out


def test_every_command_has_help_with_an_example() -> None:
    root = typer.main.get_command(app)
    commands = _commands(root)
    assert len(commands) >= 5
    for name, cmd in commands:
        assert cmd.help, f"tether {name} has no help"
        assert "Example:" in cmd.help, f"tether {name} help shows no example"


def test_error_text_is_never_read_as_markup(tmp_path: Path) -> None:
    cfg = tmp_path / "tether.toml"
    cfg.write_text(
        '[providers.p]\nbase_url = "http://127.0.0.1:1/v1"\n'
        '[agents.a]\nprovider = "q"\nmodel = "m"\n'
    )
    result = runner.invoke(app, ["sessions", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "names no [providers.…] section" in result.output


def test_config_and_ledger_are_taken_before_the_command_too(tmp_path: Path) -> None:
    loaded = tmp_path / "loaded.db"
    assert tether("ledger", "load", str(EXAMPLE), "--ledger", f"sqlite:{loaded}").returncode == 0
    cfg = write_config(tmp_path, ledger={"url": f"sqlite:{loaded}"})

    def listed(*argv: str) -> list[str]:
        done = tether(*argv, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr)
        return [json.loads(line)["id"] for line in done.stdout.splitlines()]

    assert listed("--config", str(cfg), "sessions", "--json") == ["review-42"]
    assert listed("-c", str(cfg), "sessions", "--json") == ["review-42"]
    assert listed("--ledger", f"sqlite:{loaded}", "sessions", "--json") == ["review-42"]
    # in a group's command too
    shown = tether("--ledger", f"sqlite:{loaded}", "ledger", "dump", "-s", "review-42")
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.splitlines()) == 15
    # given before and after, the one after the command applies
    assert listed("--ledger", f"sqlite:{loaded}", "sessions", "--json", "--ledger", "memory:") == []
    assert listed(
        "--config", str(tmp_path / "nope.toml"), "sessions", "--json", "-c", str(cfg)
    ) == ["review-42"]
    missing = tether("--config", str(tmp_path / "nope.toml"), "sessions")
    assert (missing.returncode, "does not exist" in one_line_error(missing)) == (2, True)


def test_config_or_ledger_before_a_command_that_takes_none_is_a_usage_error(
    tmp_path: Path,
) -> None:
    for argv in (
        ["--ledger", "memory:", "setup", "--json"],
        ["--config", "x.toml", "model", "status"],
        ["--ledger", "memory:", "model", "config"],  # its own --ledger is what it writes
        ["--ledger", "memory:", "ledger", "copy", "memory:", "memory:"],
    ):
        done = tether(*argv, cwd=tmp_path)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "does not use" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_log_marks_a_copied_request_as_a_copy(tmp_path: Path) -> None:
    """A follow-up view's copy of the previous request is a new row with ``extra.origin``:
    `tether log` says whose copy it is, so it does not read as the user asking again."""
    from tether.ledger import NewRow, RowKind, RunStatus, open_ledger

    url = f"sqlite://{tmp_path}/ledger.db"
    body = {"role": "user", "content": [{"type": "text", "text": "review it"}]}
    with open_ledger(url) as store:
        store.ensure_session("s1")
        for extra in ({}, {"origin": 1}):
            fence = store.claim_run(store.create_run("s1", "rev").id)
            row = NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=body, extra=extra)
            store.append(fence, [row], request=True)
            store.end_run(fence, RunStatus.FINISHED)
    shown = tether("log", "-s", "s1", "--ledger", url, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if "review it" in line]
    assert len(lines) == 2, shown.stdout
    assert "copy of #1" not in lines[0]
    assert "user (copy of #1)" in lines[1], shown.stdout
