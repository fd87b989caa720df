"""pi in bubblewrap (docs/security.md): what is visible inside, and the command that starts it.

Inside, at the same paths as outside: the system directories read-only (``/usr`` and its
links, ``/etc``), pi, Node and tether's extensions read-only, the agent's workdir read-write,
and the run's own pieces (a private HOME and TMPDIR, pi's agent dir and session file, the
directory of the tools and provider sockets). A fresh ``/proc`` of a new PID namespace, a
minimal ``/dev``, an empty ``/tmp`` (memory, at most ``limits.file_size_bytes``), the rest of
the root read-only; new IPC and UTS namespaces; with ``network = "provider"``
a network namespace of its own (only its loopback). Nothing else of the host exists there: not
the ledger, the config, the runs directory, another run, the user's home.

pi outlives a lost harness under its keeper (docs/architecture.md#custody): bubblewrap's parent is
never the
harness but ``outside.py``, under the keeper, and ``--die-with-parent`` ties the sandbox to
that process only (killing "pi", as custody names it, kills the sandbox). Inside, the first
process is bubblewrap's init of the PID namespace, which exits when pi does; the kernel then
kills everything left inside.

The command is ``outside.py`` (the provider forwarder, holding the key) running bubblewrap
running pi: pi's pid as custody records it is ``outside.py``'s, the leader of the process group
that pi, bubblewrap and pi's tools share, so a stop that signals the group reaches all of them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from tether.config import LimitsConfig, NetworkKind
from tether.errors import ConfigError
from tether.sandbox.outside import FORWARDED_APIS

__all__ = [
    "OUTSIDE_SCRIPT",
    "PROVIDER_ORIGIN",
    "Confinement",
    "SandboxUnavailable",
    "ToolSandbox",
    "find_bwrap",
    "probe",
    "require_bwrap",
    "require_forwarded_api",
    "split_base_url",
    "userns_problem",
]

OUTSIDE_SCRIPT = Path(__file__).resolve().parent / "outside.py"
PROVIDER_ORIGIN = "http://tether-provider.invalid"
"""The origin of a sandboxed pi's provider URL in ``models.json``: its relay
(``extension/relay.ts``) turns pi's connections to this host into connections to the
forwarder's socket."""

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; `make install` does it), "
    'or run this agent unconfined, knowingly, with [agents.{agent}] sandbox = "none" '
    "(docs/security.md)"
)
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class SandboxUnavailable(ConfigError):
    """The run would be sandboxed and cannot be: it is refused, never run unconfined."""


def find_bwrap() -> str | None:
    """``bwrap`` on PATH, or None."""
    return shutil.which("bwrap")


def userns_problem() -> str | None:
    """Why this host cannot give an unprivileged process a user namespace, or None. Root needs
    none (bubblewrap then only drops its capabilities)."""
    if os.geteuid() == 0:
        return None
    checks = (
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces is 0"),
        (
            "/proc/sys/kernel/unprivileged_userns_clone",
            "0",
            "kernel.unprivileged_userns_clone is 0",
        ),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns = 1)",
        ),
    )
    for path, bad, why in checks:
        try:
            with open(path, encoding="ascii") as f:
                if f.read().strip() == bad:
                    return why
        except OSError:
            continue
    return None


def require_bwrap(agent: str) -> str:
    """bubblewrap's path, or :class:`SandboxUnavailable` saying how to install it or opt out."""
    found = find_bwrap()
    if found is None:
        raise SandboxUnavailable(
            f"agent {agent!r} runs sandboxed and bubblewrap (bwrap) is not on PATH: "
            + INSTALL_HINT.format(agent=agent)
        )
    if (problem := userns_problem()) is not None:
        raise SandboxUnavailable(
            f"agent {agent!r} runs sandboxed and bubblewrap cannot make a user namespace here "
            f"({problem}): allow unprivileged user namespaces (sysctl), "
            + INSTALL_HINT.format(agent=agent).split(", ", 1)[1]
        )
    return found


def require_forwarded_api(agent: str, api: str) -> None:
    """:class:`SandboxUnavailable` when a sandboxed agent's provider api is not one the
    forwarder passes on (it knows each api's requests and key header; docs/security.md)."""
    if api not in FORWARDED_APIS:
        raise SandboxUnavailable(
            f"agent {agent!r} runs sandboxed and its provider's api {api!r} is not one the "
            f"sandbox's provider forwarder passes on ({', '.join(FORWARDED_APIS)}): use one "
            "of those, or run this agent unconfined, knowingly, with "
            f'[agents.{agent}] sandbox = "none"'
        )


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """Start a minimal sandbox (with its own network): None when it works, else what failed."""
    found = find_bwrap()
    if found is None:
        return "bwrap is not on PATH"
    argv = [found, *_system_args(), *_namespace_args(NetworkKind.PROVIDER), "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.strip() or f"bwrap exited with status {done.returncode}"
    return None


def split_base_url(url: str) -> tuple[str, str]:
    """A provider's ``base_url`` as (origin, path): the forwarder reaches the origin, pi asks
    for the path under its relay's address."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(f"provider base_url {url!r} is not an http:// or https:// URL")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc}", (slash + path).rstrip("/")


def _namespace_args(network: NetworkKind) -> list[str]:
    args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "tether-sandbox"]
    # The parent is outside.py (under the keeper, never the harness): the sandbox ends with it.
    args.append("--die-with-parent")
    if network is NetworkKind.PROVIDER:
        args.append("--unshare-net")
    if os.geteuid() == 0:
        # As root bubblewrap keeps every capability unless told: root inside could remount
        # its way out. Dropped, root is only the owner of root's files (and sees few).
        args += ["--cap-drop", "ALL"]
    return args


def _system_args(tmp_bytes: int | None = None) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_LINKS:
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    args += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev"]
    # The empty /tmp is memory: bounded, or a tool could fill the host's RAM through it.
    size = ["--size", str(tmp_bytes)] if tmp_bytes is not None else []
    return [*args, *size, "--tmpfs", "/tmp"]


def _covered(path: Path, by: Iterable[Path]) -> bool:
    return any(path == top or top in path.parents for top in by)


class ToolSandbox(msgspec.Struct, frozen=True, kw_only=True):
    """Where pi's tools run (docs/security.md, "Two boundaries"): the tool host
    (``extension/toolhost.ts``) in a sandbox of its own, started by ``outside.py`` beside pi's.
    It holds the workspace read-write, the system read-only, Node and the host read-only, a
    private ``/tmp`` (``HOME`` and ``TMPDIR`` are there), and its own PID, IPC and UTS
    namespaces (and network, unless ``network = "host"``). Nothing of pi: not its agent dir,
    session file, sockets or process."""

    node: Path
    """The Node binary that runs the host."""
    host: Path
    """The tool host's compiled module."""
    read_only: tuple[Path, ...]
    """What the host needs to read (Node's directory, the host's)."""
    socket: Path
    """Where pi reaches the host: a path in a directory bound into pi's sandbox only; the
    host gets the listening socket as its descriptor 3, never its name."""
    env: dict[str, str]
    """The environment of the host and so of every command: the agent's ``env``, ``PATH``,
    ``LANG``, ``TERM``, and ``HOME`` and ``TMPDIR`` in the private ``/tmp``."""

    def spec(self, bwrap: str, workdir: Path, network: NetworkKind, tmp_bytes: int) -> bytes:
        """The host's sandbox as ``outside.py --tools-spec`` reads it: its argv, then its
        environment, NUL-separated with an empty field between (in a file, not on a command
        line: the agent's ``env`` may hold credentials its tools need)."""
        args = [
            bwrap,
            *_namespace_args(network),
            *_system_args(tmp_bytes),
            "--dir",
            TOOLS_HOME,
        ]
        system = [Path("/usr"), Path("/etc")]
        for path in dict.fromkeys(self.read_only):
            if not _covered(path, system):
                args += ["--ro-bind", str(path), str(path)]
        args += ["--bind", str(workdir), str(workdir), "--remount-ro", "/"]
        args += ["--chdir", str(workdir), "--", str(self.node), str(self.host)]
        env = [f"{k}={v}" for k, v in self.env.items()]
        return "\0".join([*args, "", *env]).encode()


TOOLS_HOME = "/tmp/home"
"""``HOME`` in the tool sandbox: in its private ``/tmp``."""


class Confinement(msgspec.Struct, frozen=True, kw_only=True):
    """One run's sandbox: what it sees, its network and limits, and the provider forwarder
    outside it. With ``tools``, pi's tools run in a sandbox of their own and pi's holds no
    workspace, only an empty directory at its path (pi's working directory)."""

    bwrap: str
    network: NetworkKind
    limits: LimitsConfig
    workdir: Path
    read_only: tuple[Path, ...]
    """Directories (or files) pi needs to read: Node, pi, tether's extensions."""
    writable: tuple[Path, ...]
    """The run's own directories and files, bound read-write at the same path."""
    provider_socket: Path
    upstream: str
    """The provider's origin (``scheme://host:port``), which the forwarder reaches."""
    api: str
    """The provider's api (``[providers.X] api``): the only requests the forwarder passes on
    are that api's, and the key goes in its header alone."""
    base_path: str
    """The path of the provider's base URL (``/v1``, or ""), under which the api's requests go."""
    tools: ToolSandbox | None = None
    tools_spec: Path | None = None
    """Where :meth:`argv` writes the tool sandbox's spec (a private file of the run's)."""
    tools_log: Path | None = None
    """Where the tool host's own output goes (its commands' output is their tool result)."""

    def bwrap_argv(self, command: Sequence[str]) -> list[str]:
        """bubblewrap running ``command`` confined."""
        args = [
            self.bwrap,
            *_namespace_args(self.network),
            *_system_args(self.limits.file_size_bytes),
        ]
        system = [Path("/usr"), Path("/etc")]
        for path in dict.fromkeys(self.read_only):
            if not _covered(path, system):
                args += ["--ro-bind", str(path), str(path)]
        # Writable places last: a workdir or run directory under /tmp lands on the empty /tmp.
        for path in dict.fromkeys(self.writable):
            args += ["--bind", str(path), str(path)]
        if self.tools is None:
            args += ["--bind", str(self.workdir), str(self.workdir)]
        else:  # the workspace is the tool sandbox's: here an empty directory at its path
            args += ["--dir", str(self.workdir)]
        # The root is bubblewrap's own tmpfs holding the mount points: read-only, so nothing
        # written outside the binds and /tmp lands anywhere.
        return [*args, "--remount-ro", "/", "--chdir", str(self.workdir), "--", *command]

    def argv(self, command: Sequence[str]) -> list[str]:
        """The full command: the forwarder outside, starting bubblewrap running ``command``
        (and, with ``tools``, the tool sandbox beside it, whose spec this writes)."""
        limits = [
            f"nproc={self.limits.processes}",
            f"data={self.limits.memory_bytes}",
            f"fsize={self.limits.file_size_bytes}",
        ]
        outside = [sys.executable, "-I", "-S", str(OUTSIDE_SCRIPT)]
        outside += ["--socket", str(self.provider_socket), "--upstream", self.upstream]
        outside += ["--api", self.api, "--base-path", self.base_path]
        for limit in limits:
            outside += ["--limit", limit]
        if self.tools is not None and self.tools_spec is not None:
            spec = self.tools.spec(
                self.bwrap, self.workdir, self.network, self.limits.file_size_bytes
            )
            fd = os.open(
                self.tools_spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(fd, "wb") as f:
                f.write(spec)
            outside += ["--tools-socket", str(self.tools.socket)]
            outside += ["--tools-spec", str(self.tools_spec)]
            if self.tools_log is not None:
                outside += ["--tools-log", str(self.tools_log)]
        return [*outside, "--", *self.bwrap_argv(command)]
