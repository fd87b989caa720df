"""``tether run`` admits its request and ids before anything is written (docs/cli.md#tether-run),
and a
session loaded in the interchange shape can be followed up
(docs/contracts.md#the-interchange-format)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import Reply, ScriptedProvider, context_args, one_line_error, run_args, write_config
from support import tether as run_tether
from support.interchange import one_run_head, row_line
from support.service import text_message
from tether.ledger import RunStatus, open_ledger


def tether(*args: str | bytes, **options: Any) -> subprocess.CompletedProcess[bytes]:
    return run_tether(*args, binary=True, **options)


def _nothing_written(tmp: Path) -> None:
    db = tmp / "ledger.db"
    if db.exists():  # the ledger file may exist from an earlier step: it holds nothing new
        with open_ledger(f"sqlite://{db}") as store:
            assert store.sessions() == []
    assert not (tmp / "runs").exists()


def test_a_request_that_is_not_utf8_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    base = run_args(cfg)
    argv = tether(*base, b"caf\xe9 \xff", cwd=tmp_path)
    assert argv.returncode == 2
    assert "not valid UTF-8" in one_line_error(argv)
    piped = tether(*base, "-", stdin=b"review \xc3\x28 this", cwd=tmp_path)
    assert piped.returncode == 2
    assert "not valid UTF-8" in one_line_error(piped)
    _nothing_written(tmp_path)


def test_a_request_over_the_limit_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    big = "x" * 60_001  # the default limit: a quarter of the 240,000-byte budget
    done = tether(*run_args(cfg, "--json", big), cwd=tmp_path)
    assert done.returncode == 3
    out = json.loads(done.stdout)
    assert out["status"] == "refused"
    assert out["reason"] == "request_too_large"
    assert "60001" in out["detail"]
    piped = tether(*run_args(cfg, "-"), cwd=tmp_path, stdin=b"y" * 5_000_000)
    assert piped.returncode == 3
    assert "request_too_large" in one_line_error(piped)
    _nothing_written(tmp_path)
    # the limit is configurable
    cfg = write_config(tmp_path, followup={"request_max_bytes": 10})
    small = tether(*run_args(cfg, "eleven byte", as_json=True), cwd=tmp_path)
    assert small.returncode == 3
    assert json.loads(small.stdout)["reason"] == "request_too_large"
    _nothing_written(tmp_path)


def test_context_refuses_a_request_over_the_limit(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    done = tether(
        *context_args(cfg, as_json=True),
        "--request",
        "z" * 70_000,
        cwd=tmp_path,
    )
    assert done.returncode == 3
    assert json.loads(done.stdout)["reason"] == "request_too_large"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("-s", ""),
        ("-s", "a\nb"),
        ("-s", "tab\tid"),
        ("-a", ""),
        ("--actor", ""),
        ("--actor", "user:\x1b[31m"),
    ],
)
def test_bad_ids_exit_2_and_write_nothing(tmp_path: Path, flag: str, value: str) -> None:
    cfg = write_config(tmp_path)
    args = {"-s": "s1", "-a": "rev", "--actor": "user:ana"}
    args[flag] = value
    flat = [x for pair in args.items() for x in pair]
    done = tether("run", "--config", str(cfg), *flat, "go", cwd=tmp_path)
    assert done.returncode == 2
    kind = {"-s": "session", "-a": "agent", "--actor": "actor"}[flag]
    assert f"{kind} id" in one_line_error(done)
    _nothing_written(tmp_path)


def test_a_loaded_session_without_pi_defaults_can_be_followed_up(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """The docs/contracts.md#the-interchange-format shape: an assistant message without usage or
    stopReason. pi's
    compaction reads usage.totalTokens of every assistant message; the load fills it."""
    p = scripted_provider([Reply("follow-up answer")])
    cfg = write_config(tmp_path, p.url)
    lines = [
        *one_run_head(),
        row_line(1, "user:ana", message=text_message("user", "What is 2+2?", 1764410401000)),
        # pi reads usage.totalTokens of a timestamped assistant message: without the
        # defaults filled, pi fails ("reading 'totalTokens'")
        row_line(2, "agent:rev", message=text_message("assistant", "4", 1764410402000)),
    ]
    f = tmp_path / "s1.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    loaded = tether("ledger", "load", "--config", str(cfg), str(f), cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    done = tether(*run_args(cfg, "--actor", "user:ana", "--json", "and 3+3?"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert out["status"] == "finished"
    assert out["answer"] == "follow-up answer"
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        assert store.get_run(out["run"]).status is RunStatus.FINISHED
