"""``tether doctor`` as a user runs it: each missing piece is one failing line saying what to do,
and the exit status is 0 only when everything a run needs is there. Also: the base install works
without psycopg, and a postgresql:// ledger without it names the extra to install."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import Reply, ScriptedProvider, tether, write_config


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


def config(tmp: Path, base_url: str, ledger: str | None = None, **changes: Any) -> Path:
    """The usual test config, with the default state directory (``.tether/runs``)."""
    if ledger is not None:
        changes["ledger"] = {"url": ledger}
    return write_config(tmp, base_url, harness=None, **changes)


def doctor(
    tmp: Path, *args: str, env: dict[str, str | None] | None = None
) -> tuple[int, dict[str, dict[str, Any]]]:
    done = tether("doctor", "--json", *args, cwd=tmp, env=env)
    report = json.loads(done.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is (done.returncode == 0)
    return done.returncode, checks


def failing(checks: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name, c in checks.items() if c["status"] == "fail"]


def test_everything_there_exits_0(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("unused")])
    code, checks = doctor(tmp_path, "--config", str(config(tmp_path, p.url)))
    assert code == 0, checks
    assert list(checks)[:6] == ["python", "tether", "node", "pi", "extension", "ledger"]
    assert checks["pi"]["found"].startswith("1.6.0 ")
    assert checks["node"]["found"].startswith("v22.")
    assert "not created yet" in checks["ledger"]["found"]
    assert not (tmp_path / "ledger.db").exists(), "doctor creates nothing"
    assert "answers (HTTP" in checks["provider local"]["found"]


def test_schema_version_of_an_existing_ledger(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    from tether.ledger import open_ledger
    from tether.ledger.sqlite import SCHEMA_VERSION

    open_ledger(f"sqlite://{tmp_path}/ledger.db").close()
    p = scripted_provider([Reply("unused")])
    code, checks = doctor(tmp_path, "--config", str(config(tmp_path, p.url)))
    assert code == 0
    assert checks["ledger"]["found"].endswith(f"schema {SCHEMA_VERSION}")


@pytest.mark.pi  # doctor looks for Node and pi too
def test_unreachable_provider_is_one_failing_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    code, checks = doctor(tmp_path, "--config", str(config(tmp_path, url)))
    assert code == 1
    assert failing(checks) == ["provider local"]
    assert "does not answer" in checks["provider local"]["found"]
    assert "[providers.local] base_url" in checks["provider local"]["fix"]


def test_wrong_ledger_urls_are_one_failing_line_each(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    cfg = str(config(tmp_path, scripted_provider([Reply("unused")]).url))
    code, checks = doctor(tmp_path, "--config", cfg, "--ledger", "mysql://db/x")
    assert (code, failing(checks)) == (1, ["ledger"])
    assert "unknown ledger URL" in checks["ledger"]["found"]
    assert "postgresql://" in checks["ledger"]["fix"]
    nobody = f"postgresql://postgres@127.0.0.1:{closed_port()}/test"
    code, checks = doctor(tmp_path, "--config", cfg, "--ledger", nobody)
    assert (code, failing(checks)) == (1, ["ledger"])
    assert "fix [ledger] url" in checks["ledger"]["fix"]


def test_missing_pi_names_tether_setup(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    cfg = str(config(tmp_path, scripted_provider([Reply("unused")]).url))
    code, checks = doctor(
        tmp_path, "--config", cfg, env={"TETHER_PI": str(tmp_path / "no" / "cli.js")}
    )
    assert (code, failing(checks)) == (1, ["pi and Node"])
    assert "tether setup" in checks["pi and Node"]["fix"]


def test_unset_api_key_fails(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    url = scripted_provider([Reply("unused")]).url
    path = config(tmp_path, url, providers={"local": {"api_key_env": "TETHER_T_KEY"}})
    done = tether("doctor", "--config", str(path), env={"TETHER_T_KEY": None})
    assert done.returncode == 1
    assert "TETHER_T_KEY" in done.stdout


def test_table_on_a_terminal_shows_each_check(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    cfg = str(config(tmp_path, scripted_provider([Reply("unused")]).url))
    done = tether("doctor", "--config", cfg, cwd=tmp_path, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout
    for name in ("python", "tether", "node", "pi", "extension", "ledger", "provider local"):
        assert f" {name} " in done.stdout


def test_a_state_directory_others_may_read_is_reported(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    cfg = str(config(tmp_path, scripted_provider([Reply("unused")]).url))
    state = (tmp_path / ".tether" / "runs").resolve()  # the default runs_dir, by the config
    state.mkdir(parents=True)
    state.chmod(0o755)
    code, checks = doctor(tmp_path, "--config", cfg)
    assert code == 0, "worth knowing, not in the way of a run"
    assert failing(checks) == []
    assert checks["state directory"] == {
        "check": "state directory",
        "status": "warn",
        "found": f"{state} mode 0755 (others may read transcripts)",
        "fix": f"chmod o-rwx {state}",
    }
    table = tether("doctor", "--config", cfg, cwd=tmp_path, env={"COLUMNS": "300"})
    assert table.returncode == 0, table.stdout
    (line,) = [x for x in table.stdout.splitlines() if " state directory " in x]
    assert line.lstrip().startswith("!")
    assert "mode 0755 (others may read transcripts)" in line
    assert f"chmod o-rwx {state}" in line
    # Writable by others fails; private is fine.
    state.chmod(0o775)
    code, checks = doctor(tmp_path, "--config", cfg)
    assert (code, failing(checks)) == (1, ["state directory"])
    assert checks["state directory"]["found"].endswith("mode 0775 (writable by others)")
    assert checks["state directory"]["fix"] == f"chmod go-w {state}"
    state.chmod(0o700)
    code, checks = doctor(tmp_path, "--config", cfg)
    assert code == 0
    assert checks["state directory"]["status"] == "ok"
    assert checks["state directory"]["found"] == f"{state} mode 0700"


WITHOUT_PSYCOPG = """
import sys
sys.modules["psycopg"] = None  # as if the postgres extra were not installed
sys.modules["psycopg_pool"] = None
from tether.ledger import NewRow, open_ledger
from tether.errors import LedgerError
store = open_ledger(sys.argv[1])
store.ensure_session("s1")
fence = store.claim_run(store.create_run("s1", "a").id)
store.append(fence, [NewRow.message("user:u", {"role": "user", "content": "hi"})], request=True)
print(len(store.rows_range("s1", 1, 10)))
store.close()
try:
    open_ledger("postgresql://postgres@127.0.0.1/test")
except LedgerError as exc:
    print(exc)
"""


def test_sqlite_works_without_psycopg_and_postgres_names_the_extra(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PSYCOPG, f"sqlite://{tmp_path}/l.db"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0] == "1", "the request row was written and read back"
    assert "psycopg" in lines[1]
    assert "pip install 'tether[postgres]'" in lines[1]
    cli = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['psycopg'] = None; sys.argv[0] = 'tether';"
            "from tether.cli.app import main; main()",
            "sessions",
            "--ledger",
            "postgresql://postgres@127.0.0.1/test",
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "pip install 'tether[postgres]'" in cli.stderr


def test_the_sandbox_is_checked_and_a_missing_bwrap_fails_saying_how_to_install_it(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("unused")])
    cfg = str(config(tmp_path, p.url))
    code, checks = doctor(tmp_path, "--config", cfg)
    assert checks["sandbox"]["status"] == "ok", checks["sandbox"]
    assert "a test sandbox started" in checks["sandbox"]["found"]
    # A PATH without bwrap (Python and pi are found without PATH).
    bare = tmp_path / "bin"
    bare.mkdir()
    code, checks = doctor(tmp_path, "--config", cfg, env={"PATH": str(bare)})
    assert code == 1
    assert failing(checks) == ["sandbox"]
    assert checks["sandbox"]["found"] == "bwrap is not on PATH"
    assert "apt-get install bubblewrap" in checks["sandbox"]["fix"]


def test_an_agent_run_unconfined_is_named(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("unused")])
    path = config(tmp_path, p.url)
    path.write_text(path.read_text() + 'sandbox = "none"\n')
    code, checks = doctor(tmp_path, "--config", str(path), env={"PATH": str(tmp_path)})
    assert code == 0, checks
    assert checks["agent rev"]["status"] == "warn"
    assert 'sandbox = "none"' in checks["agent rev"]["found"]
    assert "sandbox" not in checks, "no agent is sandboxed: bwrap is not needed"
