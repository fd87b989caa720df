"""Starting one run's pi: where it works, its command line and environment, and (custody) pi
started under its keeper ahead of its run, held at its gate (:mod:`tether.pi.gate`).

``PiLaunch.start`` needs only the config and the admitted request: ``tether run`` starts pi
right after admission, and the harness writes the run's rows and pi's session file while pi
loads, then releases the gate. Nothing here touches the ledger.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from tether.config import Config, SandboxKind, WorkspaceKind
from tether.errors import ConfigError
from tether.files import private_dir, private_file
from tether.pi import keeper
from tether.pi.agentdir import NO_KEY, provider_keys, write_agent_dir
from tether.pi.continuation import NONCE_ENV, new_nonce
from tether.pi.gate import Gate
from tether.pi.install import (
    EXTENSION_DIR,
    PiInstall,
    compile_cache,
    extension_file,
    pi_argv,
    pi_env,
    warm_compile_cache,
)
from tether.pi.keys import KeyChannel, key_channel
from tether.pi.toolchannel import TOOL_NAMES, TOOLS_EXTENSION, ToolChannel
from tether.sandbox.bwrap import (
    TOOLS_HOME,
    Confinement,
    ToolSandbox,
    require_bwrap,
    split_base_url,
)
from tether.sandbox.outside import PLACEHOLDER_ENV

__all__ = [
    "RELAY_MODULE",
    "PiCommand",
    "PiLaunch",
    "check_workdir",
    "guarded_paths",
    "make_run_dir",
    "pi_command",
    "runs_dir",
    "workspaces_dir",
]


RELAY_MODULE = extension_file("relay")
"""The provider relay inside the sandbox (``extension/relay.ts``), preloaded before the gate."""
SESSION_DIR = "pi-session"
"""A sandboxed run's session file is ``RUN_DIR/pi-session/session.jsonl``, which
``RUN_DIR/session.jsonl`` links to."""
RELAY_SOCKET_ENV = "TETHER_PROVIDER_SOCKET"
TOOLBOX_EXTENSION = extension_file("toolbox")
"""pi's built-in tools through the tool sandbox (``extension/toolbox.ts``)."""
TOOLBOX_SOCKET_ENV = "TETHER_TOOLBOX_SOCKET"
TOOLHOST_MODULE = extension_file("toolhost")
"""The tool host, run by Node in the tool sandbox (``extension/toolhost.ts``)."""
_TOOL_ENV_PASSED = ("LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")


def tool_env(agent_env: Mapping[str, str], pi: PiInstall) -> dict[str, str]:
    """The tool sandbox's environment, and so every command's: the locale and terminal of
    this process, the agent's ``env``, ``HOME`` and ``TMPDIR`` in the sandbox's private
    ``/tmp``, and ``PATH`` (the pinned Node first, as pi's tools had it). Nothing of pi's:
    no agent dir, socket or token."""
    env = {k: os.environ[k] for k in _TOOL_ENV_PASSED if k in os.environ}
    env.update(agent_env)
    env["HOME"] = TOOLS_HOME
    env["TMPDIR"] = "/tmp"
    env["PATH"] = f"{pi.node_bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    return env


def runs_dir(config: Config) -> Path:
    """Where runs keep their directories (``harness.runs_dir``; relative to the config file)."""
    base = config.path.parent if config.path else Path.cwd()
    chosen = config.harness.runs_dir
    if chosen is None:
        return (base / ".tether" / "runs").resolve()
    return (chosen if chosen.is_absolute() else base / chosen).resolve()


def workspaces_dir(config: Config) -> Path:
    """Where sessions keep their workspaces (``harness.workspaces_dir``; relative to the config
    file; :mod:`tether.pi.workspace`)."""
    base = config.path.parent if config.path else Path.cwd()
    chosen = config.harness.workspaces_dir
    if chosen is None:
        return (base / ".tether" / "workspaces").resolve()
    return (chosen if chosen.is_absolute() else base / chosen).resolve()


def make_run_dir(config: Config, run_id: str) -> Path:
    """The run's private directory, with a private TMPDIR inside."""
    path = private_dir(runs_dir(config) / run_id)
    private_dir(path / "tmp")
    return path


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def guarded_paths(config: Config, ledger_path: Path | None) -> list[tuple[str, Path | None]]:
    """What no agent's tools may reach, each with its name: the ledger (None: not a file), the
    config (None: none read), the run directories."""
    return [
        ("the ledger", ledger_path),
        ("the config", config.path.resolve() if config.path else None),
        ("the run directories", runs_dir(config)),
    ]


def check_workdir(workdir: Path, *, agent: str, config: Config, ledger_path: Path | None) -> Path:
    """``workdir`` resolved (and created 0700 if missing), or ``ConfigError`` (nothing written
    yet) when it contains what the agent's tools must not reach: the ledger, the config, the run
    directories, the sessions' workspaces."""
    workdir = workdir.resolve()
    guarded = [
        *guarded_paths(config, ledger_path),
        ("the session workspaces", workspaces_dir(config)),
    ]
    for what, path in guarded:
        if path is not None and _inside(path.resolve(), workdir):
            raise ConfigError(
                f"agent {agent!r} would work in {workdir}, which contains {what} ({path}): its "
                f"tools could read or change it. Set [agents.{agent}] workdir (or --workdir) to a "
                f"directory that does not contain it, or move {what} out of {workdir}"
            )
    if not workdir.is_dir():
        if workdir.exists():
            raise ConfigError(f"agent {agent!r} would work in {workdir}, which is not a directory")
        private_dir(workdir)
    return workdir


def _loads_continuation(extensions: Sequence[Path]) -> bool:
    """Whether pi loads the continuation extension (only then is it given the run's nonce)."""
    ours = extension_file("continuation").resolve()
    return any(Path(ext).resolve() == ours for ext in extensions)


class PiCommand(msgspec.Struct, frozen=True):
    """How one run's pi is started."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]


def _node_root(path: Path) -> Path:
    """What pi needs to read around ``path`` (Node's binary, pi's entry): the ``node_modules``
    holding it, else its package (two levels up, as in ``NODE/bin/node``)."""
    for parent in path.parents:
        if parent.name == "node_modules":
            return parent
    return path.parent.parent


def _sandbox_log(run_dir: Path, text: str) -> None:
    """One line of tether's own in the run's log (pi's stderr), before pi writes there."""
    log = private_file(run_dir / "pi.log")
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"tether: {text}\n")


def _workspace_log(run_dir: Path, agent_name: str, workspace: WorkspaceKind, workdir: Path) -> None:
    """One line in the run's log: where its tools work, and whether other sessions do too."""
    if workspace is WorkspaceKind.AGENT:
        text = (
            f"workdir {workdir} is SHARED by every session of agent {agent_name!r} "
            f'([agents.{agent_name}] workspace = "agent"): this run sees and changes what other '
            "sessions' runs left there"
        )
    else:
        text = f"workspace {workdir} (this session's own)"
    _sandbox_log(run_dir, text)


def pi_command(
    config: Config,
    agent_name: str,
    *,
    pi: PiInstall,
    run_dir: Path,
    keys: KeyChannel,
    tools: ToolChannel,
    workdir: Path | None = None,
    extensions: Sequence[Path] = (),
    gate: Gate | None = None,
    nonce: str | None = None,
) -> PiCommand:
    """pi's command line and environment for the run in ``run_dir`` (its agent dir written
    there): the agent's model, tools and prompt; the keys, tools and continuation extensions;
    the key channel, the tool channel and the gate. Sandboxed (``[agents.X] sandbox``,
    docs/security.md), the command is pi in bubblewrap under the provider forwarder, which takes
    the key
    channel: pi gets no key, and its provider URL is its relay's. Raises ``ConfigError``
    (``SandboxUnavailable`` when bubblewrap cannot be used)."""
    agent = config.agent(agent_name)
    _workspace_log(run_dir, agent_name, agent.workspace, (workdir or Path.cwd()).resolve())
    sandboxed = agent.sandbox is SandboxKind.BWRAP
    bwrap = require_bwrap(agent_name) if sandboxed else ""
    agent_dir = write_agent_dir(run_dir / "agent", config, agent_name, sandboxed=sandboxed)
    session_dir: Path | None = None
    if sandboxed:
        # Node keys its compile cache by a module's real path, and a path that passes through a
        # symlink outside (a linked node_modules) is a plain directory inside: pi's modules
        # missed the cache, read-only inside, at every run (41 modules compiled again). With
        # Node and pi at their real paths, inside and outside read the same entries.
        pi = msgspec.structs.replace(pi, node=pi.node.resolve(), cli=pi.cli.resolve())
        # pi's session file lives in a directory of its own, bound into the sandbox (a path
        # bound in must exist, and the file does not until the harness writes it); the run's
        # session.jsonl names it, so everything else reads and writes it where it always is.
        session_dir = private_dir(run_dir / SESSION_DIR)
        link = run_dir / "session.jsonl"
        if not link.is_symlink():
            if link.exists():  # written already (a child pi's run prepares before its command)
                os.replace(link, session_dir / "session.jsonl")
            link.symlink_to(Path(SESSION_DIR) / "session.jsonl")
    key_extensions = () if sandboxed else keys.extensions
    # Sandboxed, pi's built-in tools run in the tool sandbox (extension/toolbox.ts).
    tool_extensions = (TOOLBOX_EXTENSION,) if sandboxed else ()
    argv = pi_argv(
        pi,
        session_file=run_dir / "session.jsonl",
        provider=agent.provider,
        model=agent.model,
        effort=agent.effort,
        # `--tools` is an allowlist that unregisters every tool it does not name, extension
        # tools included: recall and note are named whatever the agent's list holds.
        tools=list(dict.fromkeys((*agent.tools, *TOOL_NAMES))),
        system_prompt=agent.system_prompt,
        extensions=tuple(
            dict.fromkeys((*key_extensions, *extensions, TOOLS_EXTENSION, *tool_extensions))
        ),
    )
    extra: dict[str, str] = {**agent_dir.env, **keys.env, **tools.env}
    if nonce is not None and _loads_continuation(extensions):
        extra[NONCE_ENV] = nonce  # the run's nonce, which the extension takes out at load
    pass_fds = keys.pass_fds
    if gate is not None:
        argv = gate.argv(argv)
        extra.update(gate.env)
        pass_fds = (*pass_fds, *gate.pass_fds)
    home: Path | None = None
    if sandboxed:
        home = private_dir(run_dir / "home")
        # The relay goes first: pi's connections to the provider's placeholder host reach the
        # forwarder's socket from pi's first request on.
        argv = [argv[0], "--import", RELAY_MODULE.as_uri(), *argv[1:]]
        extra.update(
            {
                RELAY_SOCKET_ENV: str(tools.path.parent / "provider.sock"),
                PLACEHOLDER_ENV: NO_KEY,
                TOOLBOX_SOCKET_ENV: str(tools.path.parent / "toolbox.sock"),
            }
        )
    env = pi_env(extra, pi, tmpdir=run_dir / "tmp", agent_env=agent.env, home=home)
    if not sandboxed:
        _sandbox_log(
            run_dir,
            f'agent {agent_name!r} runs UNCONFINED ([agents.{agent_name}] sandbox = "none"): '
            "its tools can read and write whatever this user can (docs/security.md)",
        )
        return PiCommand(argv, env, pass_fds)
    read_only = [_node_root(pi.node), _node_root(pi.cli), EXTENSION_DIR]
    read_only += [Path(ext).resolve().parent for ext in extensions]
    if (cache := compile_cache()) is not None:
        warm_compile_cache(pi, cache, [config.provider(agent.provider).api])
        read_only.append(cache)
    assert home is not None
    assert session_dir is not None
    origin, base_path = split_base_url(config.provider(agent.provider).base_url)
    tool_sandbox = ToolSandbox(
        node=pi.node,
        host=TOOLHOST_MODULE,
        read_only=(_node_root(pi.node), EXTENSION_DIR),
        socket=tools.path.parent / "toolbox.sock",
        env=tool_env(agent.env, pi),
    )
    confinement = Confinement(
        bwrap=bwrap,
        network=agent.network,
        limits=agent.limits,
        workdir=(workdir or Path.cwd()).resolve(),
        read_only=tuple(read_only),
        writable=(home, run_dir / "tmp", agent_dir.path.resolve(), session_dir, tools.path.parent),
        provider_socket=tools.path.parent / "provider.sock",
        upstream=origin,
        api=config.provider(agent.provider).api,
        base_path=base_path,
        tools=tool_sandbox,
        tools_spec=run_dir / "toolbox.spec",
        tools_log=run_dir / "toolbox.log",
    )
    limits = agent.limits
    _sandbox_log(
        run_dir,
        f"sandbox bwrap, network {agent.network.value}, limits processes={limits.processes} "
        f"memory_bytes={limits.memory_bytes} file_size_bytes={limits.file_size_bytes}",
    )
    return PiCommand(confinement.argv(argv), env, pass_fds)


class PiLaunch:
    """pi for one run, started under its keeper before the run's files are written and held at
    its gate. The harness adopts it (:meth:`release` once pi's session file is written, then
    ``KeeperTransport.adopt``); a run that never starts is :meth:`discard`-ed."""

    def __init__(
        self,
        *,
        run_id: str,
        run_dir: Path,
        tools: ToolChannel,
        keeper_proc: subprocess.Popen[bytes],
        gate: Gate,
        nonce: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.nonce = nonce
        """The run's continuation nonce, in pi's environment (``tether.pi.continuation``)."""
        self.run_dir = run_dir
        self.tools = tools
        self.keeper = keeper_proc
        self.gate = gate
        self.stderr_log = run_dir / "pi.log"
        self._discarded = False

    @classmethod
    def start(
        cls,
        config: Config,
        agent_name: str,
        *,
        pi: PiInstall,
        run_id: str,
        workdir: Path,
        extensions: Sequence[Path] = (),
    ) -> PiLaunch:
        """Start the run's pi, held at its gate. ``workdir`` must have passed
        :func:`check_workdir`. Raises ``ConfigError`` (a missing provider key) or ``OSError``
        (``FileExistsError`` when the run already has a directory: a launch never takes over
        another run's files, which :meth:`discard` would remove)."""
        keys = provider_keys(config, agent_name)
        private_dir(runs_dir(config))
        (runs_dir(config) / run_id).mkdir()
        tools: ToolChannel | None = None
        gate: Gate | None = None
        try:
            run_dir = make_run_dir(config, run_id)
            tools = ToolChannel.new(run_dir)
            gate = Gate()
            nonce = new_nonce()
            with key_channel(keys) as channel:
                command = pi_command(
                    config,
                    agent_name,
                    pi=pi,
                    run_dir=run_dir,
                    keys=channel,
                    tools=tools,
                    workdir=workdir,
                    extensions=extensions,
                    gate=gate,
                    nonce=nonce,
                )
                proc = keeper.start(
                    command.argv,
                    env=command.env,
                    cwd=workdir,
                    run_dir=run_dir,
                    stderr_log=run_dir / "pi.log",
                    pass_fds=command.pass_fds,
                )
        except BaseException:
            import shutil  # only now: not on the way to pi's start

            if gate is not None:
                gate.close()
            if tools is not None and tools.private_dir is not None:
                shutil.rmtree(tools.private_dir, ignore_errors=True)
            shutil.rmtree(runs_dir(config) / run_id, ignore_errors=True)
            raise
        gate.handed_over()
        return cls(
            run_id=run_id, run_dir=run_dir, tools=tools, keeper_proc=proc, gate=gate, nonce=nonce
        )

    @property
    def released(self) -> bool:
        return self.gate.released

    def release(self) -> None:
        """Let pi through: the run's session file is written."""
        self.gate.release()

    def discard(self, grace_s: float = 3.0, *, keep_dir: bool = False) -> None:
        """The run will not start: end pi at its gate, wait for its keeper, and remove the run
        directory (``keep_dir``: a run that failed keeps it, as every failed run does). Never
        raises."""
        if self.gate.released or self._discarded:
            return
        self._discarded = True
        self.gate.close()
        # pi never passed its gate, so it has read and written nothing: it is ended now rather
        # than left to finish loading (a few hundred ms) before it finds the gate closed.
        deadline = time.monotonic() + grace_s
        while self.keeper.poll() is None and time.monotonic() < deadline:
            placement = keeper.read_placement(self.run_dir)
            pid = placement.get("pi_pid") if placement else None
            if isinstance(pid, int):
                keeper.signal_group(pid, signal.SIGKILL)  # its own group: pi and what it started
                break
            time.sleep(0.005)  # the keeper records pi's pid right after starting it
        try:
            self.keeper.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self.keeper.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.keeper.wait(timeout=grace_s)
        import shutil

        if self.tools.private_dir is not None:
            shutil.rmtree(self.tools.private_dir, ignore_errors=True)
        if not keep_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
