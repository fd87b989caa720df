"""``tether run`` as a user runs it: a subprocess, a config file, the real pi."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from support import (
    Reply,
    ScriptedProvider,
    Stall,
    ToolCall,
    route,
    run_args,
    start_tether,
    tether,
    truncated,
    wait_for,
    write_config,
)
from tether.ledger import NewRow, RunStatus, open_ledger

pytestmark = pytest.mark.pi  # every test runs `tether run`, which finds pi first


def test_run_prints_json_and_exits_0(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]), Reply("the answer")]
    )
    cfg = write_config(tmp_path, p.url)
    done = tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "finished"
    assert out["answer"] == "the answer"
    assert out["checkpoint"] == "not_needed"
    assert out["session"] == "s1"
    assert set(out) >= {"run", "session", "status", "answer", "checkpoint"}
    assert not (tmp_path / "runs" / out["run"]).exists(), "a run that ended well leaves nothing"
    plain = tether(*run_args(cfg, "again"), cwd=tmp_path)
    assert plain.returncode == 4, "the script is exhausted: the provider fails"
    assert "failed" in plain.stderr


def test_progress_only_on_a_terminal_and_rich_only_loaded_for_it(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """Progress (tool calls as they run) goes to a terminal's stderr. A run whose stderr is a
    pipe, as a bot's is, shows none and never imports rich (the interpreter's import log says
    which modules loaded); TTY_COMPATIBLE=1 tells rich that stderr is a terminal."""
    script = [Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]), Reply("the answer")]
    p = scripted_provider(script + script)
    cfg = write_config(tmp_path, p.url)
    env = {"PYTHONPROFILEIMPORTTIME": "1", "TTY_COMPATIBLE": None, "FORCE_COLOR": None}
    piped = tether(*run_args(cfg, "go"), cwd=tmp_path, env=env)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip() == "the answer"
    assert "→ bash" not in piped.stderr
    loaded = [line.split("|")[-1].strip() for line in piped.stderr.splitlines() if "|" in line]
    assert "tether.harness.run" in loaded, "the import log was read"
    assert not [m for m in loaded if m.split(".")[0] == "rich"]
    shown = tether(*run_args(cfg, "again"), cwd=tmp_path, env={**env, "TTY_COMPATIBLE": "1"})
    assert shown.returncode == 0, shown.stderr
    assert "→ bash" in shown.stderr
    assert any(line.split("|")[-1].strip() == "rich" for line in shown.stderr.splitlines())


def test_usage_and_configuration_errors_exit_2_and_write_nothing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    unknown = tether(*run_args(cfg, "go", agent="nobody"), cwd=tmp_path)
    assert unknown.returncode == 2
    assert "unknown agent 'nobody'" in unknown.stderr
    missing = tether(*run_args(tmp_path / "nope.toml", "go"), cwd=tmp_path)
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr
    no_pi_env = {"TETHER_PI": str(tmp_path / "no-such-cli.js")}
    no_pi = tether(*run_args(cfg, "go"), cwd=tmp_path, env=no_pi_env)
    assert no_pi.returncode == 2
    assert "tether setup" in no_pi.stderr  # issue 19: the advice a user without a checkout can take
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        assert store.sessions() == []


def test_refusing_session_exits_3(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        store.ensure_session("s1")
        store.set_refusing("s1", "pi's idle was not confirmed")
    done = tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path)
    assert done.returncode == 3
    assert "idle was not confirmed" in done.stderr
    assert json.loads(done.stdout)["reason"] == "session_refusing"
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        assert store.runs("s1") == []


def test_unreachable_provider_exits_4_with_the_reason(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    done = tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path)
    assert done.returncode == 4
    out = json.loads(done.stdout)
    assert out["status"] == "failed"
    assert "provider failed" in out["error"]
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        (run,) = store.runs("s1")
        assert run.status is RunStatus.FAILED
        assert run.request_seq == 1


def test_ctrl_c_stops_the_run_softly(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        [Reply("partial progress", tool_calls=[ToolCall("bash", {"command": "true"})]), Stall()]
    )
    cfg = write_config(tmp_path, p.url)
    proc = start_tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path)
    try:
        p.wait_for_requests(2, timeout=60)
        # the first turn (request, tool call, its result) is in the ledger: the run is past its
        # start and live in the second request
        with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
            wait_for(lambda: store.last_seq("s1") >= 3, 60, "the first turn's rows")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 4, stderr
    out = json.loads(stdout)
    assert out["status"] == "interrupted"
    assert out["stop_reason"] == "soft_stop"
    assert out["answer"] == "partial progress"


def test_refused_view_exits_3_and_writes_nothing(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        store.ensure_session("s1")
        broken = store.create_run("s1", "rev")
        fence = store.claim_run(broken.id)
        # A run that wrote rows but no request row: its request is incomplete.
        store.append(fence, [NewRow.message("agent:rev", {"role": "assistant", "content": []})])
        store.end_run(fence, RunStatus.FAILED)
    done = tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path)
    assert done.returncode == 3
    out = json.loads(done.stdout)
    assert out["status"] == "refused"
    assert out["reason"] == "incomplete_request"
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        assert [r.id for r in store.runs("s1")] == [broken.id]
        assert store.last_seq("s1") == 1


@pytest.mark.parametrize("detached", [True, False], ids=["custody", "no-custody"])
@pytest.mark.parametrize(
    ("inside", "what"),
    [("conf", "the config"), ("state", "the run directories"), ("db", "the ledger")],
)
def test_a_workdir_the_tools_must_not_reach_exits_2_and_writes_nothing(
    tmp_path: Path, inside: str, what: str, detached: bool
) -> None:
    """The ledger, the config and the run directories, each in a directory of its own: a
    workdir holding any one of them is refused, whether pi starts under custody's keeper
    (``tether run``'s start) or as the run's child (the harness's admission)."""
    (tmp_path / "db").mkdir()
    cfg = write_config(
        tmp_path / "conf",
        ledger={"url": f"sqlite://{tmp_path}/db/ledger.db"},
        agents={"rev": {"workdir": None}},
        harness={"runs_dir": f"{tmp_path}/state/runs"},
        custody={"detached": detached},
    )
    open_ledger(f"sqlite://{tmp_path}/db/ledger.db").close()
    workdir = tmp_path / inside
    done = tether(*run_args(cfg, "--workdir", str(workdir), "go", as_json=True), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"would work in {workdir}, which contains {what}" in done.stderr
    assert "[agents.rev] workdir (or --workdir)" in done.stderr
    assert done.stdout == ""
    with open_ledger(f"sqlite://{tmp_path}/db/ledger.db") as store:
        assert store.sessions() == []
        assert store.runs("s1") == []
    assert not (tmp_path / "state").exists(), "no run directory, no pi"


def test_an_answered_run_exits_0_whatever_became_of_its_checkpoint(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """The answer was authored: exit 0, the checkpoint's fate on stderr and in --json (a
    script retrying on 3 would ask again what was answered)."""
    long_output = Reply(tool_calls=[ToolCall("bash", {"command": "seq 1 3000"})])
    p = scripted_provider(
        route(
            task=[long_output, Reply("answer A"), long_output, Reply("answer B")],
            summary=[truncated(), Reply("## Goal\nthe summary of everything")],
        )
    )
    cfg = write_config(tmp_path, p.url, followup={"budget_bytes": 4000})
    refused = tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path)
    assert refused.returncode == 0, refused.stderr
    out = json.loads(refused.stdout)
    assert (out["answer"], out["checkpoint"]) == ("answer A", "refused:truncated")
    assert "checkpoint: refused (truncated)" in refused.stderr
    written = tether(*run_args(cfg, "again"), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert written.stdout.strip() == "answer B"
    assert "checkpoint: written" in written.stderr
