"""Hostile input through the real CLI (issue 12): every bad input is one line naming the file and
line or the argument and what to do, exit 2 (3 for a refusal), nothing written, no traceback."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support import one_line_error, read_only, run_args, tether, tmpfs, write_config
from tether.cli.app import app
from tether.errors import InterchangeError, InvalidId, LedgerError, StorageError
from tether.ledger import NewRow, open_ledger
from tether.ledger.jsonl import load_lines
from tether.ledger.sqlite import SQLiteLedger

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"
runner = CliRunner()

SESSION = '{"type":"session","id":"s","created":"2026-11-29T10:00:00Z"}'


def _row(message: str, **fields: Any) -> str:
    base = {"type": "row", "session": "s", "seq": 1, "actor": "user:ana", **fields}
    text = json.dumps(base)
    return text[:-1] + f',"message":{message}}}'


HOSTILE = {
    # each: (a second line, what the error says)
    "5,000-digit integer": (
        _row('{"role":"user","content":"x","n":' + "9" * 5000 + "}"),
        "5000 digits",
    ),
    "5,000-deep nesting": (
        _row('{"role":"user","content":"x","n":' + "[" * 5000 + "]" * 5000 + "}"),
        "nests deeper",
    ),
    "lone surrogate": (_row('{"role":"user","content":"x\\ud800"}'), "lone surrogate"),
    "timestamp 1e23": (_row('{"role":"user","content":"x","timestamp":1e23}'), "timestamp"),
    "content 42": (_row('{"role":"user","content":42}'), "message.content"),
    "NaN": (_row('{"role":"user","content":"x","timestamp":NaN}'), "NaN"),
    "Infinity": (_row('{"role":"assistant","content":[],"n":-Infinity}'), "Infinity"),
    "1e999": (_row('{"role":"user","content":"x","n":1e999}'), "not a finite number"),
    "unknown role": (_row('{"role":"wizard","content":"x"}'), "unknown role 'wizard'"),
    "assistant text content": (_row('{"role":"assistant","content":"hi"}'), "message.content"),
    "tool call without arguments": (
        _row('{"role":"assistant","content":[{"type":"toolCall","id":"c","name":"bash"}]}'),
        "'arguments'",
    ),
    "empty actor": (_row('{"role":"user","content":"x"}', actor=""), "actor"),
    "seq as a string": (_row('{"role":"user","content":"x"}', seq="1"), "seq"),
    "seq true": (_row('{"role":"user","content":"x"}', seq=True), "seq"),
    "receipt reason outside the closed set": (
        json.dumps(
            {
                "type": "row",
                "session": "s",
                "seq": 1,
                "actor": "a",
                "receipt": {"kind": "k", "reason": "boom"},
            }
        ),
        "receipt.reason",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_lines_are_refused_with_their_line(tmp_path: Path, case: str) -> None:
    line, problem = HOSTILE[case]
    url = f"sqlite:{tmp_path}/l.db"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(f"{SESSION}\n{line}\n".encode("utf-8", "surrogatepass"))
    result = runner.invoke(app, ["ledger", "load", str(bad), "--ledger", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    assert f"{bad}:2:" in result.output
    assert problem in result.output
    assert "nothing was written" in result.output
    with open_ledger(url) as ledger:
        assert ledger.sessions() == []


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ('{"type":"session","id":"","created":"t"}', "must not be empty"),
        ('{"type":"session","id":"a\\nb","created":"t"}', "printable on one line"),
        ('{"type":"session","id":"a\\u2028b","created":"t"}', "printable on one line"),
        (
            SESSION + '\n{"type":"run","id":"r","session":"s","agent":"","status":"finished"}',
            "agent",
        ),
        (SESSION + '\n{"type":"note","session":"s","agent":"","text":"n","at":"t"}', "agent"),
    ],
)
def test_bad_ids_are_refused(ledger_url: str, record: str, problem: str) -> None:
    with open_ledger(ledger_url) as ledger:
        with pytest.raises(InterchangeError) as info:
            load_lines(ledger, record.encode(), "ids.jsonl")
        assert problem in info.value.problem
        assert ledger.sessions() == []


def test_bad_ids_are_refused_by_the_ledger_api(ledger_url: str) -> None:
    with open_ledger(ledger_url) as ledger:
        for bad in ("", "a\nb", "tab\there", "\x00"):
            with pytest.raises(InvalidId):
                ledger.create_session(bad)
        ledger.create_session("s")
        with pytest.raises(InvalidId):
            ledger.create_run("s", "")
        with pytest.raises(InvalidId):
            ledger.create_run("s", "a", run_id="r\n1")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        with pytest.raises(InvalidId):
            ledger.append(fence, [NewRow.message("", {"role": "user", "content": "x"})])
        with pytest.raises(InvalidId):
            ledger.add_note("s", "", "text")
        assert ledger.last_seq("s") == 0
        assert [s.id for s in ledger.sessions()] == ["s"]


def test_pi_defaults_are_filled_on_load_and_a_dump_loads_again(ledger_url: str) -> None:
    data = "\n".join(
        [
            SESSION,
            _row('{"role":"user","content":"hi","timestamp":1}'),
            _row('{"role":"assistant","content":[{"type":"text","text":"yo"}]}', seq=2),
        ]
    ).encode()
    with open_ledger(ledger_url) as ledger:
        load_lines(ledger, data, "shape.jsonl")
        body = ledger.row("s", 2).body  # type: ignore[union-attr]
        assert body["stopReason"] == "stop"
        assert body["usage"]["totalTokens"] == 0
        assert body["usage"]["cost"]["total"] == 0
        import io

        from tether.ledger.jsonl import dump_session

        out = io.StringIO()
        dump_session(ledger, "s", out)
    with open_ledger("memory:") as again:
        load_lines(again, out.getvalue().encode(), "again")
        assert again.row("s", 2).body == body  # type: ignore[union-attr]


def test_dump_never_writes_nan(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/l.db"
    with open_ledger(url) as ledger:
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        body = {"role": "user", "content": "x", "score": float("nan")}
        ledger.append(fence, [NewRow.message("user:a", body)], request=True)
    result = tether("ledger", "dump", "--session", "s", "--ledger", url)
    err = one_line_error(result)
    assert result.returncode == 1
    assert "NaN" not in result.stdout
    assert "row 1 of session 's'" in err


def test_a_foreign_sqlite_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE sessions (x)")
        conn.execute("CREATE TABLE invoices (y)")
    before = path.read_bytes()
    result = tether("sessions", "--ledger", f"sqlite:{path}")
    err = one_line_error(result)
    assert result.returncode == 1
    assert "not a tether ledger" in err
    assert "invoices" in err
    assert path.read_bytes() == before
    text = tmp_path / "notes.txt"
    text.write_text("these are not the droids\n" * 200)
    result = tether("sessions", "--ledger", f"sqlite:{text}")
    assert "not a SQLite database" in one_line_error(result)


def test_a_tampered_row_is_named(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/l.db"
    assert tether("ledger", "load", str(EXAMPLE), "--ledger", url).returncode == 0
    with sqlite3.connect(tmp_path / "l.db") as conn:
        conn.execute("UPDATE rows SET body = '{\"role\": broken' WHERE seq = 10")
    for args in (
        ["ledger", "dump", "--session", "review-42"],
        ["log", "--session", "review-42"],
        ["context", "--session", "review-42", "--agent", "reviewer", "--json"],
    ):
        result = tether(*args, "--ledger", url)
        if args[0] == "context":  # the view names what it could not read, as a refusal
            assert result.returncode == 3, result.stderr
            assert "row 10" in json.loads(result.stdout)["detail"]
            continue
        err = one_line_error(result)
        assert result.returncode == 1
        assert "row 10 of session 'review-42' is corrupt" in err


def test_a_locked_ledger_is_a_storage_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = SQLiteLedger(f"sqlite:{path}")
    ledger._conn.execute("PRAGMA busy_timeout = 100")  # not 30 s: the test waits for it
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageError) as info:
            ledger.create_session("s")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(path) in str(info.value)
    assert "locked" in str(info.value)
    assert "retry" in str(info.value)
    ledger.create_session("s")  # and it works once the lock is gone
    ledger.close()


@pytest.fixture
def ro_mount(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs that the test makes read-only (:func:`support.read_only`)."""
    with tmpfs(tmp_path / "ro", "8m") as mnt:
        yield mnt


def test_a_read_only_ledger_can_be_read(ro_mount: Path) -> None:
    url = f"sqlite:{ro_mount}/l.db"
    assert tether("ledger", "load", str(EXAMPLE), "--ledger", url).returncode == 0
    read_only(ro_mount)
    listed = tether("sessions", "--json", "--ledger", url)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["rows"] == 11
    dumped = tether("ledger", "dump", "--session", "review-42", "--ledger", url)
    assert dumped.returncode == 0, dumped.stderr
    assert len(dumped.stdout.splitlines()) == 15
    log = tether("log", "--session", "review-42", "--json", "--ledger", url)
    assert log.returncode == 0
    assert len(log.stdout.splitlines()) == 2 + 11  # its runs, then its rows
    view = tether(
        "context", "--session", "review-42", "--agent", "reviewer", "--json", "--ledger", url
    )
    assert view.returncode == 0, view.stderr
    assert json.loads(view.stdout)["status"] == "ok"
    # a write says what is wrong, in one line
    cleared = tether("session", "clear", "review-42", "--ledger", url)
    err = one_line_error(cleared)
    assert cleared.returncode == 1
    assert "read-only" in err
    assert str(ro_mount / "l.db") in err


@pytest.mark.pi  # pi is started before the ledger is written
def test_tether_run_on_a_read_only_ledger_exits_1_like_every_command(
    ro_mount: Path, tmp_path: Path
) -> None:
    """A ledger that cannot be written is a ledger error, status 1, in ``tether run`` as in every
    other command (docs/cli.md): on the program's fast path (plain arguments) and through the
    ``run`` command (the request on stdin)."""
    url = f"sqlite:{ro_mount}/l.db"
    assert tether("ledger", "load", str(EXAMPLE), "--ledger", url).returncode == 0
    read_only(ro_mount)
    cfg = write_config(tmp_path, ledger={"url": url})
    for argv, stdin in ((run_args(cfg, "go"), None), (run_args(cfg, "-"), "go")):
        done = tether(*argv, cwd=tmp_path, stdin=stdin)
        err = one_line_error(done)
        assert done.returncode == 1, (argv, err)
        assert err.startswith("ledger error:"), err
        assert "read-only" in err
        assert str(ro_mount / "l.db") in err
    cleared = tether("session", "clear", "review-42", "--ledger", url)
    assert (cleared.returncode, one_line_error(cleared).split(":")[0]) == (1, "ledger error")


def test_load_message_does_not_wrap_when_piped(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 3)
    deep.mkdir()
    copy = deep / "review.jsonl"
    copy.write_bytes(EXAMPLE.read_bytes())
    result = tether("ledger", "load", str(copy), "--ledger", f"sqlite:{tmp_path}/l.db")
    assert result.returncode == 0
    assert result.stdout.count("\n") == 1
    assert str(copy) in result.stdout


def test_help_shows_bracketed_defaults() -> None:
    result = tether("context", "--help")
    assert result.returncode == 0
    assert "[followup]" in result.stdout


def test_log_limit_must_be_positive(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["log", "--session", "s", "--limit", "-5", "--ledger", f"sqlite:{tmp_path}/l.db"]
    )
    assert result.exit_code == 2


def test_a_log_limit_past_the_ledgers_integers_is_a_one_line_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/l.db"
    assert tether("ledger", "load", str(EXAMPLE), "--ledger", url).returncode == 0
    for limit in ("99999999999999999999", str(2**63)):
        result = tether("log", "--session", "review-42", "--limit", limit, "--ledger", url)
        err = one_line_error(result)
        assert result.returncode == 2
        assert err.startswith(f"usage error: --limit {limit} is over {2**63 - 1}"), err
    # the largest the ledger takes is fine: every row
    most = tether("log", "-s", "review-42", "--limit", str(2**63 - 1), "--json", "--ledger", url)
    assert most.returncode == 0, most.stderr
    assert len(most.stdout.splitlines()) == 2 + 11  # its runs, then every row


@pytest.mark.parametrize("url", ["mysql://x", "sqlite:", "postgresql://h/db?nonsense_option=1"])
def test_a_bad_ledger_url_exits_2(url: str) -> None:
    result = tether("sessions", "--ledger", url)
    one_line_error(result)
    assert result.returncode == 2


@pytest.mark.parametrize(
    ("toml", "problem"),
    [
        ("[followup]\nbudget_bytes = true\n", "followup.budget_bytes"),
        ("[followup]\nbudget_bytes = 1.5\n", "followup.budget_bytes"),
        ("[followup]\nbudget_bytes = 0\n", "followup.budget_bytes"),
        ("[followup]\nrequest_max_bytes = false\n", "followup.request_max_bytes"),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "nest"),
        ("a = " + "9" * 5000 + "\n", "invalid TOML"),
        # a name is an id (given as --agent, stored in the ledger): not empty, one printable line
        (
            '[providers.p]\nbase_url = "http://h/v1"\n[agents.""]\nprovider = "p"\nmodel = "m"\n',
            '[agents.""]: the name must not be empty',
        ),
        ('[agents."a\\tb"]\nprovider = "p"\nmodel = "m"\n', '[agents."a\\tb"]: the name must'),
        (
            '[providers.""]\nbase_url = "http://h/v1"\n',
            '[providers.""]: the name must not be empty',
        ),
    ],
)
def test_bad_config_values_exit_2(tmp_path: Path, toml: str, problem: str) -> None:
    cfg = tmp_path / "tether.toml"
    cfg.write_text(toml)
    result = tether("sessions", "--config", str(cfg))
    err = one_line_error(result)
    assert result.returncode == 2
    assert problem in err


def test_a_config_that_is_not_utf8_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "tether.toml"
    cfg.write_bytes(b"[ledger]\nurl = '\xff'\n")
    result = tether("sessions", "--config", str(cfg))
    assert "not UTF-8" in one_line_error(result)
    assert result.returncode == 2


def test_ledger_errors_are_ledger_errors() -> None:
    assert issubclass(StorageError, LedgerError)
    assert issubclass(InvalidId, LedgerError)


def test_a_session_file_is_written_whatever_a_stored_timestamp_holds(tmp_path: Path) -> None:
    """Rows appended through the API (or stored before loads checked timestamps) may hold a
    timestamp no date can: pi's session file still gets a date it can parse."""
    from tether.pi.sessionfile import PreEntry, write_session_file

    messages = [
        PreEntry({"role": "user", "content": "x", "timestamp": ts}, seq=i)
        for i, ts in enumerate([1e23, float("nan"), -1e20, 1764410401000], start=1)
    ]
    write_session_file(tmp_path / "s.jsonl", session_id="r", cwd=tmp_path, messages=messages)
    from datetime import datetime

    for line in (tmp_path / "s.jsonl").read_text().splitlines():
        stamp = json.loads(line)["timestamp"]
        assert datetime.fromisoformat(stamp.replace("Z", "+00:00")).year >= 2025


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["ledger", "dump", "--session", ""], "session"),
        (["log", "--session", "a\nb"], "session"),
        (["session", "clear", "\x1b[2J"], "session"),
        (["context", "--session", "s", "--agent", ""], "agent"),
        (["context", "--session", "s", "--agent", "a", "--actor", "user:\n"], "actor"),
    ],
)
def test_bad_ids_on_the_command_line_exit_2(tmp_path: Path, args: list[str], kind: str) -> None:
    result = runner.invoke(app, [*args, "--ledger", f"sqlite:{tmp_path}/l.db"])
    assert result.exit_code == 2, result.output
    assert f"{kind} id" in " ".join(result.output.split())
    assert not (tmp_path / "l.db").exists()  # refused before the ledger was opened


def test_a_repeated_pi_entry_id_is_refused_with_its_line(ledger_url: str) -> None:
    rows = [
        json.dumps(
            {
                "type": "row",
                "session": "s",
                "seq": i,
                "actor": "user:ana",
                "entry": "e1" if i in (2, 4) else f"x{i}",
                "message": {"role": "user", "content": str(i)},
            }
        )
        for i in range(1, 6)
    ]
    with open_ledger(ledger_url) as ledger:
        with pytest.raises(InterchangeError) as info:
            load_lines(ledger, "\n".join([SESSION, *rows]).encode(), "dup.jsonl")
        assert info.value.line == 5  # the second row carrying e1
        assert "'e1' appears twice" in info.value.problem
        assert ledger.sessions() == []
        load_lines(ledger, "\n".join([SESSION, *rows[:3]]).encode(), "ok.jsonl")
        more = json.loads(rows[3])  # seq 4, entry e1: already in the ledger
        with pytest.raises(InterchangeError) as again:
            load_lines(ledger, json.dumps(more).encode(), "more.jsonl")
        assert again.value.line == 1
        assert ledger.last_seq("s") == 3


def test_what_the_mirror_writes_dumps_and_loads_again(ledger_url: str) -> None:
    """Every message shape the mirror stores (pi's custom and branch-summary entries among
    them) survives dump → load."""
    import io

    from tether.ledger.jsonl import dump_session
    from tether.mirror.entries import entry_message

    entries = [
        {
            "type": "custom_message",
            "id": "e1",
            "customType": "note",
            "content": "hi",
            "display": True,
            "timestamp": "2026-11-29T10:00:00.000Z",
        },
        {"type": "custom_message", "id": "e2", "content": [{"type": "text", "text": "x"}]},
        {
            "type": "branch_summary",
            "id": "e3",
            "summary": "s",
            "fromId": "e1",
            "timestamp": "2026-11-29T10:00:01.000Z",
        },
    ]
    with open_ledger(ledger_url) as ledger:
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        for e in entries:
            message = entry_message(e)
            assert message is not None
            ledger.append(fence, [NewRow.message("agent:a", message, entry_id=e["id"])])
        out = io.StringIO()
        dump_session(ledger, "s", out)
    with open_ledger("memory:") as again:
        load_lines(again, out.getvalue().encode(), "dump.jsonl")
        assert again.last_seq("s") == 3
