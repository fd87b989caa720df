"""A workspace per session: with the real pi, sandboxed, the scripted provider driving the bash
tool, on SQLite and PostgreSQL. A session's runs work in a directory of the session's own, made
from the agent's workdir at its first run (a copy, or a git worktree on ``tether/<session>``),
kept between its runs, copied by a fork and removed by erasure; another session, run by another
actor or at the same moment, never sees it. ``workspace = "agent"`` keeps one shared directory,
and the run's log and ``tether doctor`` say so."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pg import postgres_url
from provider import RecordedRequest, Reply, ScriptedProvider, Step, ToolCall
from support.cli import start_tether, tether
from support.config import write_config
from tether.config import load_config
from tether.pi.workspace import branch_name, run_workdir, workspace_home, workspace_name

pytestmark = pytest.mark.slow

Provider = Callable[..., ScriptedProvider]
PREFIX = "RUN: "


def shell(on_command: Callable[[RecordedRequest], None] | None = None) -> Callable[..., Step]:
    """A script where each request is a bash command (``RUN: COMMAND``): pi runs it with its
    bash tool and answers ``out: OUTPUT``. ``on_command`` sees each request as its command is
    asked for (the run is live then)."""

    def step(req: RecordedRequest) -> Step:
        last = req.messages[-1] if req.messages else {}
        if last.get("role") == "tool":
            return Reply("out: " + RecordedRequest._text(last.get("content")))
        if on_command is not None:
            on_command(req)
        command = req.last_user_text.removeprefix(PREFIX)
        return Reply(tool_calls=[ToolCall("bash", {"command": command})])

    return step


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    # (on disk: pi's run and the test's reads are other processes and connections)
    return f"sqlite://{tmp_path}/ledger.db" if request.param == "sqlite" else postgres_url(tmp_path)


def run(cfg: Path, session: str, command: str, *, actor: str = "user:local") -> dict[str, Any]:
    """``tether run --json`` of ``command`` on ``session``: its outcome (finished)."""
    done = tether(
        *("run", "--config", str(cfg), "-s", session, "-a", "rev", "--actor", actor, "--json"),
        PREFIX + command,
        cwd=cfg.parent,
    )
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    assert outcome["status"] == "finished", outcome
    return outcome


def tree(tmp: Path, session: str) -> Path:
    """Where ``session``'s tools work (the default workspaces directory, beside the config)."""
    return tmp / ".tether" / "workspaces" / workspace_name(session) / "tree"


def logs_of_live_runs(runs: Path) -> str:
    """The logs of the runs live now (a run that ends well removes its directory)."""
    return "".join(p.read_text() for p in sorted(runs.glob("r-*/pi.log")))


def git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def git_template(path: Path) -> None:
    """``path`` as a git repository with one commit (README)."""
    path.mkdir(exist_ok=True)
    (path / "README").write_text("the template\n")
    git(path, "init", "--quiet", "--initial-branch=main")
    git(path, "add", "README")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "one")


def test_a_session_s_workspace_is_its_own_and_kept_between_its_runs(
    tmp_path: Path, scripted_provider: Provider, ledger_url: str
) -> None:
    logs: list[str] = []
    p = scripted_provider(shell(lambda _req: logs.append(logs_of_live_runs(tmp_path / "runs"))))
    cfg = write_config(tmp_path, p.url, ledger={"url": ledger_url})
    (tmp_path / "work" / "template.txt").write_text("from the template\n")

    ana = run(
        cfg, "ana-s", "cat template.txt; echo ana wrote this > note.txt; pwd", actor="user:ana"
    )
    assert "from the template" in ana["answer"]
    assert str(tree(tmp_path, "ana-s")) in ana["answer"]  # pwd: the session's tree
    assert f"tether: workspace {tree(tmp_path, 'ana-s')} (this session's own)" in logs[0]

    # bob's run on his own session finds nothing ana's session wrote …
    bob = run(cfg, "bob-s", "cat note.txt; ls -A", actor="user:bob")
    assert "No such file or directory" in bob["answer"], bob
    assert "ana wrote this" not in bob["answer"]
    assert "template.txt" in bob["answer"]  # (his own copy of the template)
    # … while ana's next run, on her session, finds it; and the template is untouched.
    again = run(cfg, "ana-s", "cat note.txt", actor="user:ana")
    assert "ana wrote this" in again["answer"], again
    assert sorted(os.listdir(tmp_path / "work")) == ["template.txt"]
    assert (tree(tmp_path, "ana-s") / "note.txt").is_file()
    assert not (tree(tmp_path, "bob-s") / "note.txt").exists()
    for session in ("ana-s", "bob-s"):
        home = tree(tmp_path, session).parent
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE(home.parent.stat().st_mode) == 0o700


def test_two_sessions_running_at_once_edit_separate_trees(
    tmp_path: Path, scripted_provider: Provider, ledger_url: str
) -> None:
    # Each run writes who.txt, waits (in the provider) until the other has written its own,
    # then reads who.txt back: in one shared directory one of them reads the other's.
    written = threading.Barrier(2, timeout=120)

    def step(req: RecordedRequest) -> Step:
        me = req.last_user_text
        tools = [m for m in req.messages if m.get("role") == "tool"]
        if len(tools) == 0:
            return Reply(tool_calls=[ToolCall("bash", {"command": f"echo {me} > who.txt"})])
        if len(tools) == 1:
            written.wait()
            return Reply(tool_calls=[ToolCall("bash", {"command": "cat who.txt"})])
        return Reply("out: " + RecordedRequest._text(tools[-1].get("content")))

    p = scripted_provider(step)
    cfg = write_config(tmp_path, p.url, ledger={"url": ledger_url})
    procs = {
        s: start_tether(
            "run", "--config", str(cfg), "-s", s, "-a", "rev", "--json", s, cwd=tmp_path
        )
        for s in ("c1", "c2")
    }
    answers = {}
    for s, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        answers[s] = json.loads(out)["answer"].strip()
    assert answers == {"c1": "out: c1", "c2": "out: c2"}, answers
    assert (tree(tmp_path, "c1") / "who.txt").read_text() == "c1\n"
    assert (tree(tmp_path, "c2") / "who.txt").read_text() == "c2\n"
    assert not (tmp_path / "work" / "who.txt").exists()


def _shell_config(tmp: Path, scripted_provider: Provider, ledger_url: str, kind: str) -> Path:
    """A config whose provider runs each request as a shell command, its template ``tmp/work``
    a git repository when ``kind`` is ``git`` (else a plain directory, copied)."""
    p = scripted_provider(shell())
    cfg = write_config(tmp, p.url, ledger={"url": ledger_url})
    if kind == "git":
        git_template(tmp / "work")
    return cfg


def test_a_git_template_gives_a_worktree_on_the_session_s_branch(
    tmp_path: Path, scripted_provider: Provider, ledger_url: str
) -> None:
    cfg = _shell_config(tmp_path, scripted_provider, ledger_url, "git")
    template = tmp_path / "work"

    done = run(cfg, "g1", "echo changed >> README; echo new > added.txt; cat README; pwd")
    assert "the template\nchanged" in done["answer"]
    worktree = tree(tmp_path, "g1")
    assert str(worktree) in done["answer"]
    # A worktree of the template's repository, on the session's own branch, holding the
    # session's changes; the template's own tree and branch are as they were.
    assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD").strip() == "tether/g1"
    assert branch_name("g1") == "tether/g1"
    listed = git(template, "worktree", "list", "--porcelain")
    assert f"worktree {worktree}\n" in listed
    assert "branch refs/heads/tether/g1\n" in listed
    assert git(worktree, "status", "--porcelain").splitlines() == [" M README", "?? added.txt"]
    assert (template / "README").read_text() == "the template\n"
    assert not (template / "added.txt").exists()
    assert git(template, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    # The next run of the session works in the same worktree.
    assert "new" in run(cfg, "g1", "cat added.txt")["answer"]
    # A session id that is no plain name gets a branch git takes, its own.
    odd = "review: PR #7 / ana's"
    run(cfg, odd, "echo odd > odd.txt")
    branch = git(tree(tmp_path, odd), "rev-parse", "--abbrev-ref", "HEAD").strip()
    assert branch == branch_name(odd)
    assert branch.startswith("tether/review-PR-7-ana-s+"), branch


@pytest.mark.parametrize("kind", ["copy", "git"])
def test_fork_copies_the_session_s_workspace_for_the_new_session(
    tmp_path: Path, scripted_provider: Provider, ledger_url: str, kind: str
) -> None:
    cfg = _shell_config(tmp_path, scripted_provider, ledger_url, kind)
    first = run(cfg, "f1", "echo parent > p.txt")
    done = tether("fork", "--config", str(cfg), "-s", "f1", "--at", first["run"], "-n", "f2")
    assert done.returncode == 0, done.stderr
    assert "its workspace: a copy of f1's" in done.stdout

    child = run(cfg, "f2", "cat p.txt; echo child > c.txt")
    assert "parent" in child["answer"], child
    assert "No such file" in run(cfg, "f1", "cat c.txt")["answer"]  # the parent's is its own
    if kind == "git":
        # A new worktree on its own branch, made from the parent's, with the parent's
        # uncommitted changes.
        forked = tree(tmp_path, "f2")
        assert git(forked, "rev-parse", "--abbrev-ref", "HEAD").strip() == "tether/f2"
        assert sorted(git(forked, "status", "--porcelain").splitlines()) == [
            "?? c.txt",
            "?? p.txt",
        ]
        assert git(forked, "rev-parse", "HEAD") == git(tmp_path / "work", "rev-parse", "tether/f1")


@pytest.mark.parametrize("kind", ["copy", "git"])
def test_erasing_a_session_removes_its_workspace(
    tmp_path: Path, scripted_provider: Provider, ledger_url: str, kind: str
) -> None:
    cfg = _shell_config(tmp_path, scripted_provider, ledger_url, kind)
    template = tmp_path / "work"
    run(cfg, "e1", "echo gone soon > e.txt")
    run(cfg, "e2", "echo stays > e.txt")
    assert (tree(tmp_path, "e1") / "e.txt").is_file()

    dry = tether("erase", "--config", str(cfg), "-s", "e1", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["workspaces"] == ["e1"]
    assert (tree(tmp_path, "e1") / "e.txt").is_file()
    done = tether("erase", "--config", str(cfg), "-s", "e1", "--json")
    assert done.returncode == 0, done.stderr
    erased = json.loads(done.stdout)
    assert erased["workspaces"] == ["e1"]
    assert erased["counts"]["workspaces"] == 1
    assert not tree(tmp_path, "e1").parent.exists()
    assert (tree(tmp_path, "e2") / "e.txt").read_text() == "stays\n"
    assert os.listdir(tmp_path / ".tether" / "workspaces" / ".making") == []
    if kind == "git":
        assert git(template, "branch", "--list", "tether/e1") == ""
        assert "tether/e2" in git(template, "branch", "--list", "tether/e2")
        assert str(tree(tmp_path, "e1")) not in git(template, "worktree", "list")
    # A new session of the same id starts from the template again.
    assert "No such file" in run(cfg, "e1", "cat e.txt")["answer"]


def test_workspace_agent_keeps_one_shared_directory_and_says_so(
    tmp_path: Path, scripted_provider: Provider, ledger_url: str
) -> None:
    logs: list[str] = []
    p = scripted_provider(shell(lambda _req: logs.append(logs_of_live_runs(tmp_path / "runs"))))
    cfg = write_config(
        tmp_path, p.url, ledger={"url": ledger_url}, agents={"rev": {"workspace": "agent"}}
    )
    run(cfg, "ana-s", "echo ana wrote this > note.txt; pwd", actor="user:ana")
    bob = run(cfg, "bob-s", "cat note.txt", actor="user:bob")
    assert "ana wrote this" in bob["answer"]
    assert (tmp_path / "work" / "note.txt").is_file()
    assert not (tmp_path / ".tether" / "workspaces").exists()
    shared = (
        f"tether: workdir {tmp_path / 'work'} is SHARED by every session of agent 'rev' "
        '([agents.rev] workspace = "agent")'
    )
    assert shared in logs[0], logs[0]
    doctor = tether("doctor", "--json", "--config", str(cfg), cwd=tmp_path)
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["agent rev"]["status"] == "warn"
    assert 'workspace = "agent"' in checks["agent rev"]["found"]
    assert 'remove workspace = "agent" from [agents.rev]' in checks["agent rev"]["fix"]
    assert "workspaces" not in checks  # no agent uses them


def test_racing_first_runs_make_one_workspace(tmp_path: Path) -> None:
    """Eight makers of one session's first workspace at once (processes on several hosts do
    the same through the shared directory): each gets the same tree, one of them made, and
    nothing is left half-made; for a worktree, one worktree and one branch."""
    (tmp_path / "work" / "sub").mkdir(parents=True)
    (tmp_path / "work" / "sub" / "f").write_text("x\n")
    git_template(tmp_path / "repo")
    cfg = load_config(
        write_config(
            tmp_path,
            agents={"git": {"provider": "local", "model": "m", "workdir": "repo"}},
        )
    )
    got: list[Path | BaseException] = []

    def make(agent: str, session: str) -> None:
        try:
            got.append(run_workdir(cfg, agent, session, ledger_path=None))
        except BaseException as exc:
            got.append(exc)

    makers = [threading.Thread(target=make, args=("rev", "s1")) for _ in range(4)]
    makers += [threading.Thread(target=make, args=("git", "s2")) for _ in range(4)]
    for t in makers:
        t.start()
    for t in makers:
        t.join()
    assert (
        sorted(map(str, got))
        == [str(workspace_home(cfg, "s1") / "tree")] * 4
        + [str(workspace_home(cfg, "s2") / "tree")] * 4
    )
    assert (workspace_home(cfg, "s1") / "tree" / "sub" / "f").read_text() == "x\n"
    root = tmp_path / ".tether" / "workspaces"
    assert sorted(os.listdir(root)) == [".making", "s1", "s2"]
    assert os.listdir(root / ".making") == []
    worktrees = git(tmp_path / "repo", "worktree", "list", "--porcelain")
    assert worktrees.count("worktree ") == 2, worktrees
    assert "locked" not in worktrees
    branches = git(tmp_path / "repo", "for-each-ref", "--format=%(refname)", "refs/heads/tether")
    assert branches.split() == ["refs/heads/tether/s2"]
