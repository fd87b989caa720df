"""A session's workspace: the directory its runs' tools work in, made at its first run from the
agent's workdir (the template), kept between its runs, copied by a fork, removed by erasure.

    workdir = run_workdir(config, "rev", "s1", ledger_path=ledger.path)  # made if missing

With ``[agents.X] workspace = "agent"`` the run works in the template itself, as every session
of the agent does (:func:`run_workdir` only checks it).

Layout: ``WORKSPACES_DIR/NAME/`` (0700) holds ``workspace.json`` (the session it belongs to and
how it was made) and ``tree/``, the directory handed to pi and its sandbox as the workdir; the
sandbox binds the tree only. ``NAME`` is the session id when that is a plain name (letters,
digits, ``.``, ``_``, ``-``), else a slug of it, ``+`` and a hash of the id
(:func:`workspace_name`): one directory per session, never shared.

How it is made from the template:

- a git repository (the template is the top of a work tree whose HEAD has a commit): ``git
  worktree add`` at the template's HEAD, then the branch ``tether/NAME`` made there
  (:func:`branch_name`), so the session's changes are changes (and commits) on its own branch;
- anything else: a copy that keeps modes (less setuid and setgid) and times, copies symbolic
  links as links, never follows one (each directory is opened ``O_NOFOLLOW``) and leaves out
  sockets and devices.

Several hosts and processes: a workspace is made in ``WORKSPACES_DIR/.making/`` and published by
one ``rename`` to its name; the first rename wins and the others discard theirs and use it, so
two hosts that make a session's first run at once (pi is started ahead of custody) end with
one workspace. For a worktree, git's record of it is repaired after the rename and the branch
made only then, by the winner; the worktree stays locked (so that no ``git worktree prune``
drops it while its path changes) until it is ready, which ``workspace.json`` records. What
runs in the tree is serialized by custody: one live run per session, and a pi started ahead
waits at its gate until its run is claimed.

Once a run has had a tree, the tree is the agent's: its ``.git`` file may point anywhere. tether
never runs git inside a used tree; it asks the template's repository (``git -C TEMPLATE``).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import hashlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from tether.config import Config, WorkspaceKind
from tether.errors import ConfigError, WorkspaceError
from tether.files import DIR_MODE, private_dir
from tether.pi.launch import check_workdir, guarded_paths, runs_dir, workspaces_dir
from tether.pi.treecopy import clear_tree, copy_tree, remove_tree

__all__ = [
    "BRANCH_PREFIX",
    "Made",
    "Workspace",
    "branch_name",
    "fork_workspace",
    "read_workspace",
    "remove_workspace",
    "run_workdir",
    "session_workdir",
    "workspace_home",
    "workspace_name",
    "workspaces_dir",
]

META = "workspace.json"
TREE = "tree"
MAKING = ".making"
"""Workspaces being made (and removed), beside the published ones: a rename away from them."""
BRANCH_PREFIX = "tether/"
STALE_S = 24 * 3600.0
"""A directory in ``.making/`` this old was left by a process that died: it is removed."""
GIT_TIMEOUT_S = 600.0
READY_WAIT_S = 30.0
"""How long a run waits for another process to make the session's worktree ready before it
takes that over (its maker died)."""
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SLUG_OUT = re.compile(r"[^A-Za-z0-9_-]+")
_GIT_ENV_DROPPED = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_COMMON_DIR",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
    }
)


class _BranchTaken(WorkspaceError):
    """The session's branch exists in the template's repository, and the session has no
    workspace."""


class Made(enum.StrEnum):
    """How a session's workspace was made from its template."""

    COPY = "copy"
    GIT = "git"
    """A linked worktree of the template's repository, on the branch ``Workspace.branch``."""


class Workspace(msgspec.Struct, frozen=True, kw_only=True):
    """``workspace.json``: whose workspace it is and how it was made."""

    session: str
    made: Made
    template: str
    """The template's path (for a worktree: its repository's work tree, where git is run)."""
    branch: str | None = None
    ready: bool = True
    """False for a worktree until its record is repaired and its branch made."""


def workspace_name(session: str) -> str:
    """The directory name (and branch suffix) of ``session``'s workspace: the id itself when it
    is plain (a letter or digit, then up to 63 letters, digits, ``.``, ``_``, ``-``; no ``..``,
    not ending in ``.`` or ``.lock``), else a slug of it, ``+`` and 20 hex digits of its SHA-256.
    ``+`` never occurs in a plain name, so two sessions never share a name."""
    if _PLAIN.fullmatch(session) and ".." not in session and not session.endswith((".", ".lock")):
        return session
    slug = _SLUG_OUT.sub("-", session).strip("-")[:32] or "session"
    digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return f"{slug}+{digest}"


def branch_name(session: str) -> str:
    """The git branch of ``session``'s worktree: ``tether/NAME``."""
    return BRANCH_PREFIX + workspace_name(session)


def workspace_home(config: Config, session: str) -> Path:
    """The directory of ``session``'s workspace (its tree is ``tree/`` inside)."""
    return workspaces_dir(config) / workspace_name(session)


def read_workspace(config: Config, session: str) -> Workspace | None:
    """``session``'s workspace record, or None when it has none. Raises ``WorkspaceError`` when
    the directory holds another session's (or an unreadable) record."""
    found = _read_meta(workspace_home(config, session))
    if found is not None and found.session != session:
        raise WorkspaceError(
            f"{workspace_home(config, session)} holds the workspace of session "
            f"{found.session!r}, not of {session!r}"
        )
    return found


def session_workdir(config: Config, agent: str, session: str) -> Path:
    """Where a run of ``agent`` on ``session`` works, made or not (a resumed run's, whose pi
    works there already): the session's tree, or the agent's workdir (``workspace =
    "agent"``)."""
    if config.agent(agent).workspace is WorkspaceKind.AGENT:
        return config.workdir(agent)
    return workspace_home(config, session) / TREE


def run_workdir(
    config: Config,
    agent: str,
    session: str,
    *,
    ledger_path: Path | None,
    workdir: Path | None = None,
) -> Path:
    """Where a run of ``agent`` on ``session`` works: the session's workspace, made now from
    the template (``workdir``, else the agent's) when this is its first run; with
    ``workspace = "agent"``, the template itself. Raises ``ConfigError`` (nothing written) when
    the template or the workspaces directory holds what the tools must not reach, and
    ``WorkspaceError`` when the workspace cannot be made."""
    template = check_workdir(
        workdir or config.workdir(agent), agent=agent, config=config, ledger_path=ledger_path
    )
    if config.agent(agent).workspace is WorkspaceKind.AGENT:
        return template
    root = _check_root(config, ledger_path)
    if root == template or root in template.parents:
        raise ConfigError(
            f"agent {agent!r}'s workdir {template} is inside the session workspaces ({root}): "
            f"set [agents.{agent}] workdir to a directory outside {root}"
        )
    return _ensure(config, session, template)


def _check_root(config: Config, ledger_path: Path | None) -> Path:
    """The workspaces directory, when it holds nothing the tools must not reach and is not
    inside the run directories (whose pruning would remove it); else ``ConfigError``."""
    root = workspaces_dir(config)
    for what, path in guarded_paths(config, ledger_path):
        if path is not None and (root == path.resolve() or root in path.resolve().parents):
            raise ConfigError(
                f"the session workspaces ({root}) would contain {what} ({path}): every "
                "session's tools could read or change it. Set [harness] workspaces_dir to a "
                f"directory that does not contain it, or move {what} out of {root}"
            )
    runs = runs_dir(config)
    if runs in root.parents:
        raise ConfigError(
            f"the session workspaces ({root}) are inside the run directories ({runs}): set "
            "[harness] workspaces_dir outside them"
        )
    return root


def _ensure(config: Config, session: str, template: Path) -> Path:
    home = workspace_home(config, session)
    found = read_workspace(config, session)
    if found is None:
        tmp = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=_making(config)))
        try:
            made = _make(tmp, session, template)
            won = _publish(tmp, home)
        except _BranchTaken as taken:
            _discard(tmp)
            # Taken by whoever published the session's workspace meanwhile, or refused.
            if read_workspace(config, session) is None:
                raise WorkspaceError(str(taken)) from None
            won = False
        except BaseException:
            _discard(tmp)
            raise
        if won:
            if not made.ready:
                _finish(home, made)
            return home / TREE
        # Another process or host made it first: theirs is the session's.
        _discard(tmp)
        found = read_workspace(config, session)
        if found is None:
            raise WorkspaceError(f"{home} appeared without {META}: remove it, then run again")
    if not found.ready:
        found = _wait_ready(config, session, found)
        if not found.ready:  # its maker died before it was ready
            _finish(home, found)
    return home / TREE


def _wait_ready(config: Config, session: str, found: Workspace) -> Workspace:
    """``session``'s workspace once its maker has made it ready (a second or so), or as it is
    after ``READY_WAIT_S``."""
    deadline = time.monotonic() + READY_WAIT_S
    while not found.ready and time.monotonic() < deadline:
        time.sleep(0.1)
        found = read_workspace(config, session) or found
    return found


def fork_workspace(config: Config, parent: str, child: str) -> Workspace | None:
    """Copy ``parent``'s workspace for ``child`` (a fork): a copy of its tree, or for a
    worktree a new worktree on ``tether/CHILD`` made from the parent's branch, with the parent's
    uncommitted changes (its tree as it is now, ignored and untracked files included) copied
    over it. None when ``parent`` has no workspace (``child``'s first run makes one). Raises
    ``WorkspaceError``, and when ``child`` has a workspace already."""
    src = read_workspace(config, parent)
    if src is None:
        return None
    home = workspace_home(config, child)
    if home.exists():
        raise WorkspaceError(f"session {child!r} has a workspace already ({home})")
    tmp = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=_making(config)))
    tree = tmp / TREE
    parent_tree = workspace_home(config, parent) / TREE
    try:
        if src.made is Made.COPY:
            made = Workspace(session=child, made=Made.COPY, template=src.template)
            _write_meta(tmp, made)
            copy_tree(parent_tree, tree)
        else:
            repo = Path(src.template)
            if src.branch is None:
                raise WorkspaceError(f"session {parent!r}'s worktree has no branch recorded")
            start = _git(repo, "rev-parse", "--verify", "--quiet", f"{_ref(src.branch)}^{{commit}}")
            made = Workspace(
                session=child,
                made=Made.GIT,
                template=src.template,
                branch=branch_name(child),
                ready=False,
            )
            _write_meta(tmp, made)
            with _locked(repo):
                _git(repo, "worktree", "add", "--detach", "--lock", str(tree), start.strip())
            # The parent's tree as it is (its uncommitted changes), never its .git file.
            clear_tree(tree, keep=".git")
            copy_tree(parent_tree, tree, skip=".git")
        if not _publish(tmp, home):
            raise WorkspaceError(f"session {child!r} has a workspace already ({home})")
    except BaseException:
        _discard(tmp)
        raise
    if not made.ready:
        _finish(home, made)
        made = msgspec.structs.replace(made, ready=True)
    return made


def remove_workspace(config: Config, session: str) -> Workspace | None:
    """Remove ``session``'s workspace (erasure, retention): a worktree with ``git worktree
    remove --force`` and its branch deleted, a copy with its tree. None when it has none.
    Raises ``WorkspaceError`` when something of it could not be removed."""
    home = workspace_home(config, session)
    found = read_workspace(config, session)
    if found is None:
        if home.exists():  # a workspace being made was cut short here: no record, only files
            _remove_aside(config, home)
        return None
    problems: list[str] = []
    if found.made is Made.GIT:
        repo = Path(found.template)
        tree = home / TREE
        try:
            with _locked(repo):
                _git(repo, "worktree", "remove", "--force", "--force", str(tree))
        except WorkspaceError as exc:
            # Its .git file is the agent's to change, and git may not know the tree for its
            # own: the files go, and git forgets worktrees whose directory is gone.
            problems.append(str(exc))
    _remove_aside(config, home)
    if found.made is Made.GIT:
        repo = Path(found.template)
        if problems:
            with _locked(repo):
                _git_quiet(repo, "worktree", "prune")
        # (A worktree that was never ready may have its branch: no other has that name, as a
        # workspace is not made where its branch exists.)
        if found.branch is not None:
            try:
                with _locked(repo):
                    _git(repo, "branch", "--delete", "--force", found.branch)
            except WorkspaceError as exc:
                if _git_quiet(repo, "rev-parse", "--verify", "--quiet", _ref(found.branch)):
                    raise WorkspaceError(
                        f"session {session!r}'s workspace is removed, but not its branch: {exc}"
                    ) from None
    return found


# -- making ------------------------------------------------------------------------------------


def _making(config: Config) -> Path:
    """``WORKSPACES_DIR/.making`` (0700), with what dead processes left there removed."""
    making = private_dir(workspaces_dir(config) / MAKING)
    cutoff = time.time() - STALE_S
    old = []
    with os.scandir(making) as entries:
        for entry in entries:
            # (What another process renames away or removes meanwhile is gone: not old.)
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    old.append(entry.path)
    for path in old:
        _discard(Path(path))
    return making


def _make(tmp: Path, session: str, template: Path) -> Workspace:
    """The workspace of ``session`` made from ``template`` in ``tmp`` (not yet published)."""
    if _git_top(template):
        if _git_quiet(template, "rev-parse", "--verify", "--quiet", _ref(branch_name(session))):
            raise _BranchTaken(
                f"the repository {template} has a branch {branch_name(session)} already, and "
                f"session {session!r} no workspace: it was left by an earlier session of that "
                "id, or made by hand. Delete or rename it (git branch -m), then run again"
            )
        made = Workspace(
            session=session,
            made=Made.GIT,
            template=str(template),
            branch=branch_name(session),
            ready=False,
        )
        _write_meta(tmp, made)  # first: a discarded worktree is found by it
        with _locked(template):
            _git(template, "worktree", "add", "--detach", "--lock", str(tmp / TREE), "HEAD")
        os.chmod(tmp / TREE, DIR_MODE)
        return made
    made = Workspace(session=session, made=Made.COPY, template=str(template))
    _write_meta(tmp, made)
    copy_tree(template, tmp / TREE)
    return made


def _publish(tmp: Path, home: Path) -> bool:
    """``tmp`` renamed to ``home``: True, or False when ``home`` exists (someone was first). A
    workspace directory is never empty (it holds its record), so the rename cannot replace
    one."""
    try:
        os.rename(tmp, home)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


def _finish(home: Path, made: Workspace) -> None:
    """A published worktree made ready: git told where it is now, its branch made there, its
    lock lifted. Run by whoever published it, or by the next run when that one died first (no
    run has had the tree yet: a workspace that is not ready is not handed out)."""
    repo = Path(made.template)
    tree = home / TREE
    assert made.branch is not None
    with _locked(repo):
        _git(repo, "worktree", "repair", str(tree))
        try:
            _git(tree, "switch", "--quiet", "--create", made.branch)
        except WorkspaceError:
            # Made already by another process finishing the same workspace; else a branch of
            # that name that is not this workspace's (refused, as when it is made).
            head = _git_quiet(tree, "symbolic-ref", "--quiet", "HEAD")
            if head is None or head.strip() != f"refs/heads/{made.branch}":
                raise
        _git_quiet(repo, "worktree", "unlock", str(tree))
    _write_meta(home, msgspec.structs.replace(made, ready=True))


def _discard(tmp: Path) -> None:
    """Remove a workspace that was not published (or is being removed). Never raises."""
    found = None
    with contextlib.suppress(WorkspaceError):
        found = _read_meta(tmp)
    if found is not None and found.made is Made.GIT and (tmp / TREE).exists():
        repo = Path(found.template)
        with contextlib.suppress(OSError, WorkspaceError), _locked(repo):
            if (
                _git_quiet(repo, "worktree", "remove", "--force", "--force", str(tmp / TREE))
                is None
            ):
                remove_tree(tmp / TREE)
                _git_quiet(repo, "worktree", "prune")
    remove_tree(tmp)


def _remove_aside(config: Config, home: Path) -> None:
    """Rename ``home`` into ``.making/`` (from then on no run finds it), then remove it."""
    aside = Path(tempfile.mkdtemp(prefix=f"{home.name}.removing.", dir=_making(config)))
    try:
        os.rename(home, aside / "gone")
    except FileNotFoundError:
        remove_tree(aside)
        return
    if not remove_tree(aside):
        raise WorkspaceError(f"cannot remove all of {home} (what is left is in {aside})")


# -- the record ----------------------------------------------------------------------------------


def _read_meta(home: Path) -> Workspace | None:
    try:
        data = (home / META).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise WorkspaceError(f"cannot read {home / META}: {exc}") from exc
    try:
        return msgspec.json.decode(data, type=Workspace)
    except msgspec.DecodeError as exc:
        raise WorkspaceError(f"{home / META} is not a workspace record: {exc}") from exc


def _write_meta(home: Path, made: Workspace) -> None:
    tmp = home / f"{META}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(made) + b"\n")
    os.replace(tmp, home / META)


# -- git -----------------------------------------------------------------------------------------


def _git_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROPPED}


def _git(where: Path, *args: str) -> str:
    """``git -C WHERE ARGS``' output; ``WorkspaceError`` when it fails or git is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=_git_env(),
            timeout=GIT_TIMEOUT_S,
            check=False,
            umask=0o077,
        )
    except FileNotFoundError:
        raise WorkspaceError(
            f"{where} is a git repository, and git is not on PATH: install git, or set "
            '[agents.…] workspace = "agent"'
        ) from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise WorkspaceError(f"git {' '.join(args)} in {where}: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise WorkspaceError(
            f"git {' '.join(args)} in {where} failed (exit {done.returncode})"
            + (f": {said[-1]}" if said else "")
        )
    return done.stdout


@contextlib.contextmanager
def _locked(repo: Path) -> Iterator[None]:
    """tether's git commands on one repository's worktrees, one at a time (across processes,
    and hosts where the shared storage has locks): each reads the records of every worktree,
    and one that another ``git worktree add`` is writing makes it fail ("failed to read
    .git/worktrees/…/commondir"). The lock is ``tether-worktrees.lock`` in the repository's
    git directory."""
    common = _git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    fd = os.open(
        Path(common) / "tether-worktrees.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ref(branch: str) -> str:
    return f"refs/heads/{branch}"


def _git_quiet(where: Path, *args: str) -> str | None:
    """``git -C WHERE ARGS``' output, or None when it fails."""
    try:
        return _git(where, *args)
    except WorkspaceError:
        return None


def _git_top(template: Path) -> bool:
    """Whether ``template`` is the top of a git work tree whose HEAD is a commit."""
    if not (template / ".git").exists():
        return False
    top = _git(template, "rev-parse", "--show-toplevel").strip()
    if Path(top).resolve() != template.resolve():
        return False
    return _git_quiet(template, "rev-parse", "--verify", "--quiet", "HEAD^{commit}") is not None
