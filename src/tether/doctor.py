"""``tether doctor``: what a run needs, and whether it is there (one line per check).

Every check answers without changing anything: the ledger is opened read-only (a SQLite file
that does not exist yet is not created), providers are asked with one ``GET {base_url}/models``
and any HTTP answer counts (a 401 still proves the server is there), and no key is sent.
"""

from __future__ import annotations

import enum
import os
import sqlite3
import stat
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.config import Config, ledger_file
from tether.errors import BadLedgerUrl

__all__ = ["Check", "Status", "run_checks"]

PROVIDER_TIMEOUT_S = 3.0
MIN_PYTHON = (3, 11)


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    """Worth knowing, not in the way of a run."""
    FAIL = "fail"

    @property
    def blocks(self) -> bool:
        return self is Status.FAIL


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "status": self.status.value,
            "found": self.found,
            "fix": self.fix,
        }


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < MIN_PYTHON:
        return Check("python", Status.FAIL, version, "tether needs Python >= 3.11")
    return Check("python", Status.OK, f"{version} ({sys.executable})")


def _tether() -> Check:
    from importlib.metadata import PackageNotFoundError, version

    import tether

    where = str(Path(tether.__file__).resolve().parent)
    try:
        return Check("tether", Status.OK, f"{version('tether')} ({where})")
    except PackageNotFoundError:
        return Check("tether", Status.OK, f"from source ({where})")


def _pi() -> list[Check]:
    import subprocess

    from tether.pi.errors import PiNotInstalled
    from tether.pi.install import find_pi

    try:
        pi = find_pi()
    except PiNotInstalled as exc:
        fix = "run `tether setup` (installs the pinned pi and Node 22 with npm)"
        return [Check("pi and Node", Status.FAIL, str(exc).split(";")[0], fix)]
    try:
        node = subprocess.run(
            [str(pi.node), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return [
            Check(
                "node", Status.FAIL, f"{pi.node} does not run: {exc}", "run `tether setup --force`"
            ),
            Check("pi", Status.OK, f"{pi.version} ({pi.cli})"),
        ]
    return [
        Check("node", Status.OK, f"{node} ({pi.node})"),
        Check("pi", Status.OK, f"{pi.version} ({pi.cli})"),
    ]


def _extension() -> Check:
    from tether.pi.install import extension_file

    ext = extension_file("continuation")
    if ext.is_file():
        return Check("extension", Status.OK, str(ext))
    return Check("extension", Status.FAIL, f"{ext} is missing", "reinstall tether")


def _ledger(url: str) -> Check:
    name = "ledger"
    if url == "memory:":
        return Check(name, Status.OK, "memory: (in this process only, nothing kept)")
    if url.startswith("sqlite:"):
        from tether.ledger.sqlite import SCHEMA_VERSION

        try:
            path = ledger_file(url)
        except BadLedgerUrl as exc:
            return Check(name, Status.FAIL, str(exc), "fix [ledger] url")
        assert path is not None
        if not path.exists():
            parent = next((p for p in (path.parent, *path.parents) if p.exists()), Path("/"))
            if not os.access(parent, os.W_OK):
                return Check(
                    name, Status.FAIL, f"{path}: {parent} is not writable", "fix [ledger] url"
                )
            return Check(name, Status.OK, f"{path} (not created yet; the first run creates it)")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
            try:
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            finally:
                conn.close()
        except sqlite3.Error as exc:
            return Check(name, Status.FAIL, f"{path}: {exc}", "fix [ledger] url or the file")
        return _schema(name, f"{path}", version, SCHEMA_VERSION)
    if url.startswith(("postgresql://", "postgres://")):
        return _postgres(url)
    return Check(
        name,
        Status.FAIL,
        f"unknown ledger URL {url!r}",
        "set [ledger] url to memory:, sqlite:///PATH or postgresql://USER@HOST/DB",
    )


def _schema(name: str, where: str, version: int, current: int) -> Check:
    if version > current:
        return Check(
            name, Status.FAIL, f"{where}: schema {version}, newer than {current}", "upgrade tether"
        )
    if version < current:
        return Check(name, Status.OK, f"{where}: schema {version} (migrated to {current} on use)")
    return Check(name, Status.OK, f"{where}: schema {version}")


def _postgres(url: str) -> Check:
    name = "ledger"
    try:
        import psycopg

        from tether.ledger.postgres import SCHEMA_VERSION, _redacted
    except ImportError:
        return Check(
            name, Status.FAIL, "postgresql:// needs psycopg", "pip install 'tether[postgres]'"
        )
    where = _redacted(url)
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass('tether_schema') IS NOT NULL").fetchone()
            if not row or not row[0]:
                return Check(name, Status.OK, f"{where}: reachable, empty (first use creates it)")
            got = conn.execute("SELECT version FROM tether_schema").fetchone()
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check(
            name,
            Status.FAIL,
            f"{where}: {first}",
            "start PostgreSQL or fix [ledger] url (user, host, database)",
        )
    return _schema(name, where, int(got[0]) if got else 0, SCHEMA_VERSION)


def _providers(config: Config) -> list[Check]:
    checks = []
    where = config.path or "tether.toml"
    if not config.providers:
        return [
            Check(
                "providers",
                Status.FAIL,
                f"none configured in {where}",
                "add [providers.NAME] and [agents.NAME]",
            )
        ]
    for name, provider in sorted(config.providers.items()):
        label = f"provider {name}"
        url = provider.base_url.rstrip("/") + "/models"
        try:
            with urllib.request.urlopen(url, timeout=PROVIDER_TIMEOUT_S) as resp:
                answer = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            answer = f"HTTP {exc.code}"  # an answer all the same: the server is there
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            checks.append(
                Check(
                    label,
                    Status.FAIL,
                    f"{provider.base_url} does not answer ({reason})",
                    f"start the provider, or fix [providers.{name}] base_url in {where}",
                )
            )
            continue
        if provider.api_key_env and not os.environ.get(provider.api_key_env):
            checks.append(
                Check(
                    label,
                    Status.FAIL,
                    f"{provider.base_url} answers ({answer}); ${provider.api_key_env} is not set",
                    f"export {provider.api_key_env}=…",
                )
            )
        else:
            checks.append(Check(label, Status.OK, f"{provider.base_url} answers ({answer})"))
    return checks


def _state_dir(config: Config) -> Check:
    from tether.harness.run import runs_dir

    state = runs_dir(config)
    if not state.exists():
        return Check("state directory", Status.OK, f"{state} (not created yet)")
    mode = stat.S_IMODE(state.stat().st_mode)
    found = f"{state} mode {mode:04o}"
    if mode & 0o022:
        return Check(
            "state directory", Status.FAIL, found + " (writable by others)", f"chmod go-w {state}"
        )
    if mode & 0o007:
        return Check(
            "state directory",
            Status.WARN,
            found + " (others may read transcripts)",
            f"chmod o-rwx {state}",
        )
    return Check("state directory", Status.OK, found)


def _workspaces(config: Config) -> list[Check]:
    """Every agent whose sessions share one workdir, named; where the sessions' workspaces are
    and whether others may enter it."""
    from tether.config import WorkspaceKind
    from tether.pi.launch import workspaces_dir

    checks = [
        Check(
            f"agent {name}",
            Status.WARN,
            f'workspace = "agent": every session works in {config.workdir(name)}, and sees '
            "what the others left there",
            f'remove workspace = "agent" from [agents.{name}] to give each session its own',
        )
        for name, agent in sorted(config.agents.items())
        if agent.workspace is WorkspaceKind.AGENT
    ]
    if config.agents and not any(
        a.workspace is WorkspaceKind.SESSION for a in config.agents.values()
    ):
        return checks
    root = workspaces_dir(config)
    if not root.exists():
        return [*checks, Check("workspaces", Status.OK, f"{root} (not created yet)")]
    mode = stat.S_IMODE(root.stat().st_mode)
    found = f"{root} mode {mode:04o}"
    if mode & 0o077:
        fix = f"chmod go-rwx {root}"
        return [*checks, Check("workspaces", Status.WARN, found + " (others may enter)", fix)]
    return [*checks, Check("workspaces", Status.OK, found)]


def _sandbox(config: Config) -> list[Check]:
    """bubblewrap and user namespaces, when an agent runs sandboxed; every agent that does not,
    named (docs/security.md)."""
    from tether.config import SandboxKind
    from tether.sandbox.bwrap import find_bwrap, probe, userns_problem

    checks = [
        Check(
            f"agent {name}",
            Status.WARN,
            'sandbox = "none": its tools run unconfined, with every file and process of this user',
            f'remove sandbox = "none" from [agents.{name}] (docs/security.md)',
        )
        for name, agent in sorted(config.agents.items())
        if agent.sandbox is SandboxKind.NONE
    ]
    sandboxed = any(a.sandbox is SandboxKind.BWRAP for a in config.agents.values())
    if not sandboxed and config.agents:
        return checks
    # With no agents yet, the default (sandboxed) is what the first one will need.
    blocks = Status.FAIL if sandboxed else Status.WARN
    install = "apt-get install bubblewrap (make install does it)"
    found = find_bwrap()
    if found is None:
        return [*checks, Check("sandbox", blocks, "bwrap is not on PATH", install)]
    if (problem := userns_problem()) is not None:
        fix = "allow unprivileged user namespaces (sysctl), or run as root"
        return [*checks, Check("sandbox", blocks, f"{found}: {problem}", fix)]
    if (failed := probe()) is not None:
        return [*checks, Check("sandbox", blocks, f"{found} cannot start a sandbox: {failed}")]
    return [*checks, Check("sandbox", Status.OK, f"{found} (a test sandbox started)")]


def run_checks(config: Config, ledger_url: str | None = None) -> list[Check]:
    """Every check, in the order a run meets them."""
    return [
        _python(),
        _tether(),
        *_pi(),
        _extension(),
        _ledger(ledger_url or config.ledger.url),
        *_providers(config),
        *_sandbox(config),
        *_workspaces(config),
        _state_dir(config),
    ]
