"""What a run reads bounds what it may reveal, and secrets stay out (docs/security.md), with the
real
pi and the scripted provider: provider keys reach pi only over the key channel, tools get an
allow-listed environment, obligations travel to the rows a run writes, the agent's workdir never
holds the ledger, and tether's files are private."""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import support
from support import (
    Fail,
    Reply,
    ScriptedProvider,
    Stall,
    ToolCall,
    context_args,
    files_under,
    run_args,
    start_tether,
    tether,
)
from tether.ledger import NewRow, RowKind, RunStatus, open_ledger


def write_config(tmp: Path, url: str, *, workdir: str | None = "work", **changes: Any) -> Path:
    """The usual test config with a provider that needs a key (``TETHER_TEST_PROVIDER_KEY``), the
    ledger and the run directories under ``state/``, and pi's retries off."""
    return support.write_config(
        tmp,
        url,
        ledger={"url": f"sqlite://{tmp}/state/ledger.db"},
        providers={"local": {"api_key_env": "TETHER_TEST_PROVIDER_KEY"}},
        agents={"rev": {"workdir": workdir}},
        harness={"runs_dir": "state/runs", "pi_settings": {"retry": {"enabled": False}}},
        **changes,
    )


def holds(path: Path, needle: bytes) -> bool:
    try:
        return needle in path.read_bytes()
    except OSError:
        return False


def test_a_bash_env_in_a_run_leaves_no_key_on_disk_or_in_the_ledger(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    key = "sk-tether-" + secrets.token_hex(16)
    # `env`, then enough output that pi spills it to a pi-bash-*.log in its TMPDIR; then the
    # provider fails, so the run directory is kept and can be searched too.
    command = "env > envdump.txt; env; seq 1 200000"
    p = scripted_provider([Reply(tool_calls=[ToolCall("bash", {"command": command})]), Fail(500)])
    cfg = write_config(tmp_path, p.url)
    system_tmp = Path(tempfile.gettempdir())
    before = {q.name for q in system_tmp.glob("pi-bash-*")}
    done = tether(
        *run_args(cfg, "--json", "show me"),
        cwd=tmp_path,
        env={"TETHER_TEST_PROVIDER_KEY": key, "TETHER_CONFIG": str(cfg)},
    )
    assert done.returncode == 4, done.stderr
    out = json.loads(done.stdout)
    # The key reached the provider (so pi had it) ...
    headers = {k.lower(): v for k, v in p.requests[0].headers.items()}
    assert headers.get("authorization") == f"Bearer {key}"
    # ... but not the tool: what `env` saw has no key and none of tether's variables.
    with open_ledger(f"sqlite://{tmp_path}/state/ledger.db") as store:
        assert [r.role for r in store.iter_rows("s1")].count("toolResult") == 1
    env_text = (support.workspace_tree(tmp_path) / "envdump.txt").read_text()
    assert "PATH=" in env_text
    assert "TMPDIR=" in env_text
    assert key not in env_text
    assert "TETHER_CONFIG" not in env_text
    assert "TETHER_TEST_PROVIDER_KEY" not in env_text
    # Nowhere on disk: the run directory (kept, the run failed), the ledger and its WAL, the
    # session's workspace, the system temp directory.
    run_dir = tmp_path / "state" / "runs" / out["run"]
    assert run_dir.is_dir(), "a failed run keeps its directory"
    assert str(run_dir) in done.stderr or str(run_dir) in out.get("error", "")
    spilled = list((run_dir / "tmp").glob("pi-bash-*"))
    assert spilled, "pi's bash spill file goes to the run's private TMPDIR"
    searched = files_under(tmp_path) + [
        q for q in system_tmp.glob("pi-bash-*") if q.name not in before
    ]
    assert len(searched) > 5
    leaks = [q for q in searched if holds(q, key.encode())]
    assert leaks == []
    assert not [q for q in system_tmp.glob("pi-bash-*") if q.name not in before]


def test_a_quoted_withheld_row_makes_the_answer_withheld(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("The secret plan says: launch on Friday.")])
    grants = {"user:ana": ["repo:acme/*"], "user:carl": ["repo:acme/secret"]}
    cfg = write_config(tmp_path, p.url, access={"grants": grants})
    with open_ledger(f"sqlite://{tmp_path}/state/ledger.db") as store:
        store.ensure_session("s1")
        run = store.create_run("s1", "other")
        fence = store.claim_run(run.id)
        store.append(
            fence,
            [
                NewRow(
                    actor="user:ana",
                    kind=RowKind.MESSAGE,
                    body={"role": "user", "content": [{"type": "text", "text": "the plan?"}]},
                ),
                NewRow(
                    actor="agent:other",
                    kind=RowKind.MESSAGE,
                    sources=("repo:acme/secret",),
                    body={
                        "role": "assistant",
                        "content": [{"type": "text", "text": "SECRET PLAN: launch on Friday"}],
                        "stopReason": "stop",
                    },
                ),
            ],
            request=False,
        )
        from tether.ledger import RunStatus

        store.end_run(fence, RunStatus.FINISHED)
    done = tether(
        *run_args(cfg, "--actor", "user:ana", "--json", "what is the plan?"),
        cwd=tmp_path,
        env={"TETHER_TEST_PROVIDER_KEY": "k"},
    )
    assert done.returncode == 0, done.stderr
    assert "SECRET PLAN" in p.requests[0].raw.decode(), "ana's run was given the secret row"
    with open_ledger(f"sqlite://{tmp_path}/state/ledger.db") as store:
        written = [r for r in store.iter_rows("s1") if r.run == json.loads(done.stdout)["run"]]
    answer = next(r for r in written if r.role == "assistant")
    assert "repo:acme/secret" in answer.sources

    def view(actor: str, status: int) -> dict[str, object]:
        shown = tether(
            *context_args(cfg),
            "--actor",
            actor,
            "--json",
            cwd=tmp_path,
        )
        assert shown.returncode == status, shown.stderr
        return dict(json.loads(shown.stdout))

    bob = view("user:bob", 0)
    text = json.dumps(bob)
    assert "launch on Friday" not in text
    assert "SECRET PLAN" not in text
    assert any(g["why"] == "withheld" and g["from"] <= answer.seq <= g["to"] for g in bob["gaps"])
    carl = view("user:carl", 0)
    assert "launch on Friday" in json.dumps(carl["messages"])


@pytest.mark.pi  # the workdir is checked once pi is found
def test_a_workdir_holding_the_ledger_or_config_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1", workdir=None)
    refused = tether(*run_args(cfg, "go"), cwd=tmp_path, env={"TETHER_TEST_PROVIDER_KEY": "k"})
    assert refused.returncode == 2, refused.stderr
    assert "contains the ledger" in refused.stderr
    assert "workdir" in refused.stderr
    assert refused.stderr.count("\n") <= 2
    with open_ledger(f"sqlite://{tmp_path}/state/ledger.db") as store:
        assert store.sessions() == []
    assert not (tmp_path / "state" / "runs").exists()
    # Elsewhere, it is the config the workdir must not hold.
    state = tmp_path / "elsewhere"
    state.mkdir()
    moved = tmp_path / "work" / "tether.toml"
    moved.write_text(
        cfg.read_text()
        .replace(f"sqlite://{tmp_path}/state", f"sqlite://{state}")
        .replace('runs_dir = "state/runs"', f'runs_dir = "{state}/runs"')
    )
    refused = tether(
        "run",
        "--config",
        str(moved),
        "-s",
        "s1",
        "-a",
        "rev",
        "go",
        env={"TETHER_TEST_PROVIDER_KEY": "k"},
        cwd=tmp_path / "work",
    )
    assert refused.returncode == 2, refused.stderr
    assert "contains the config" in refused.stderr


def test_files_are_private_whatever_the_umask(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Fail(500)])
    cfg = write_config(tmp_path, p.url)
    done = tether(
        *run_args(cfg, "--json", "go"), cwd=tmp_path, env={"TETHER_TEST_PROVIDER_KEY": "k"}, umask=0
    )
    assert done.returncode == 4, done.stderr
    run_dir = tmp_path / "state" / "runs" / json.loads(done.stdout)["run"]
    ledger = tmp_path / "state" / "ledger.db"
    checked = [ledger, run_dir / "session.jsonl", run_dir / "pi.log"]
    checked += [run_dir / "agent" / "models.json", run_dir / "agent" / "settings.json"]
    checked += [q for q in (ledger.with_name("ledger.db-wal"),) if q.exists()]
    for path in checked:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (tmp_path / "state", tmp_path / "state" / "runs", run_dir, run_dir / "agent"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE((run_dir / "tmp").stat().st_mode) == 0o700


def test_a_run_that_ends_well_leaves_no_directory_and_prune_removes_old_ones(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("done")])
    cfg = write_config(tmp_path, p.url)
    done = tether(
        *run_args(cfg, "--json", "go"), cwd=tmp_path, env={"TETHER_TEST_PROVIDER_KEY": "k"}
    )
    assert done.returncode == 0, done.stderr
    runs = tmp_path / "state" / "runs"
    assert not (runs / json.loads(done.stdout)["run"]).exists()
    old, recent = runs / "r-old", runs / "r-recent"
    left = runs / ".discarded" / "r-left"  # a removal that was cut short
    for path in (old, recent, left):
        (path / "agent").mkdir(parents=True)
        (path / "pi.log").write_text("log")
    week_ago = time.time() - 8 * 86400
    os.utime(old, (week_ago, week_ago))
    pruned = tether("runs", "prune", "--older-than", "7d", "--config", str(cfg), cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1" in pruned.stdout
    assert not old.exists()
    assert recent.exists()
    assert not left.exists(), "what was set aside to be removed goes too, whatever its age"
    bad = tether("runs", "prune", "--older-than", "soon", "--config", str(cfg), cwd=tmp_path)
    assert bad.returncode == 2
    assert "7d" in bad.stderr


def test_prune_keeps_the_directories_of_live_runs_and_removes_old_ended_ones(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Stall(), Fail(500, "down")])
    cfg = write_config(tmp_path, p.url)
    key: dict[str, str | None] = {"TETHER_TEST_PROVIDER_KEY": "k"}
    # s1: a run that is running (its provider request stalls).
    running = start_tether(*run_args(cfg, "go", as_json=True), cwd=tmp_path, env=key)
    try:
        p.wait_for_requests(1, timeout=60)
        # s2: a run that failed; its directory is kept, as for every run that did not end well.
        failed = tether(*run_args(cfg, "go", session="s2", as_json=True), cwd=tmp_path, env=key)
        assert failed.returncode == 4, failed.stderr
        runs = tmp_path / "state" / "runs"
        with open_ledger(f"sqlite://{tmp_path}/state/ledger.db") as store:
            (live,) = store.live_runs(session="s1")
            assert live.status is RunStatus.RUNNING
            (ended,) = store.runs("s2")
            assert ended.status is RunStatus.FAILED
            # s3: a run still queued (no worker takes it), with a directory of its own.
            queued, _ = store.enqueue_run("s3", "rev", actor="user:local", text="later")
        (runs / queued.id / "agent").mkdir(parents=True)
        dirs = {name: runs / run for name, run in (("running", live.id), ("failed", ended.id))}
        dirs["queued"] = runs / queued.id
        week_ago = time.time() - 8 * 86400
        for path in dirs.values():
            assert path.is_dir(), path
            os.utime(path, (week_ago, week_ago))
        pruned = tether("runs", "prune", "--older-than", "7d", "--config", str(cfg), cwd=tmp_path)
        assert pruned.returncode == 0, pruned.stderr
        assert "removed 1 run directory older than 7d" in pruned.stdout
        assert f"kept {dirs['running']}: its run is still live" in pruned.stdout
        assert f"kept {dirs['queued']}: its run is still live" in pruned.stdout
        assert not dirs["failed"].exists()
        assert dirs["running"].is_dir()
        assert (dirs["running"] / "session.jsonl").exists(), "pi's files are untouched"
        assert dirs["queued"].is_dir()
        assert running.poll() is None
    finally:
        running.send_signal(signal.SIGINT)  # a soft stop: the stalled run ends interrupted
        out, err = running.communicate(timeout=60)
    assert json.loads(out)["status"] == "interrupted", err
