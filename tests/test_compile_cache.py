"""Node's compile cache, filled outside the sandbox (``tether.pi.install.warm_compile_cache``).

A sandboxed pi may read the cache but not write it, so whatever the warm-up leaves out is
compiled again at every sandboxed run. These run the real pinned pi against the scripted
provider, with Node's own account of each module it loads (``NODE_DEBUG_NATIVE=COMPILE_CACHE``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgspec

from provider import Reply, ScriptedProvider, ToolCall
from support.config import load_test_config
from tether.pi.agentdir import write_agent_dir
from tether.pi.install import (
    EXTENSION_DIR,
    WARM_SCRIPT,
    extension_file,
    find_pi,
    pi_argv,
    pi_env,
    warm_compile_cache,
    warm_modules,
)
from tether.pi.keys import KEYS_EXTENSION
from tether.pi.toolchannel import TOOL_NAMES, TOOLS_EXTENSION

DEBUG = {"NODE_DEBUG_NATIVE": "COMPILE_CACHE"}


def compiled(log: str) -> list[str]:
    """The modules Node compiled from source: not found in the cache (its words, Node 22)."""
    return re.findall(r"cache for (\S+) was not initialized", log)


def accepted(log: str) -> list[str]:
    return re.findall(r"cache for (\S+) was accepted", log)


def one_run(tmp_path: Path, provider_url: str, cache: Path) -> str:
    """A pi run as a sandboxed run loads it (resolved paths, tether's extensions, a bash tool
    call), driven over RPC until it settles: Node's compile cache log."""
    cfg = load_test_config(tmp_path, provider_url)
    agent = cfg.agent("rev")
    found = find_pi()
    pi = msgspec.structs.replace(found, node=found.node.resolve(), cli=found.cli.resolve())
    run_dir = tmp_path / "run"
    agent_dir = write_agent_dir(run_dir / "agent", cfg, "rev")
    (run_dir / "tmp").mkdir()
    argv = pi_argv(
        pi,
        session_file=run_dir / "session.jsonl",
        provider=agent.provider,
        model=agent.model,
        effort=agent.effort,
        tools=[*agent.tools, *TOOL_NAMES],
        system_prompt=agent.system_prompt,
        extensions=(KEYS_EXTENSION, extension_file("continuation"), TOOLS_EXTENSION),
    )
    env = {**pi_env(agent_dir.env, pi, tmpdir=run_dir / "tmp"), "NODE_COMPILE_CACHE": str(cache)}
    log = tmp_path / "pi.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**env, **DEBUG},
            cwd=tmp_path / "work",
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps({"id": "1", "type": "prompt", "message": "go"}).encode())
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        settled = any(json.loads(line).get("type") == "agent_settled" for line in proc.stdout)
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    assert settled
    return log.read_text(errors="replace")


def test_after_the_warm_up_a_run_compiles_none_of_the_modules_it_loads(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]), Reply("done")]
    )
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    warm_compile_cache(find_pi(), cache, ["openai-completions"])
    log = one_run(tmp_path, p.url, cache)
    assert compiled(log) == []
    names = {url.rsplit("/", 1)[-1] for url in accepted(log)}
    # pi's entry and runtime (--version), and what only a run loads (warm.js): the provider's
    # client, pi's extension loader (CommonJS), tether's extensions and the modules they import.
    assert {"cli.js", "cli-runtime.js", "jiti.cjs"} <= names, names
    assert {"keys.js", "continuation.js", "tools.js", "pimodules.js"} <= names, names
    assert any(n.startswith("openai-completions-") for n in names), names
    assert len(p.requests) == 2


def test_without_the_modules_step_the_run_compiles_what_it_loads_after_the_entry(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    # The control: pi's entry run alone (`--version`, the warm-up before warm.js) leaves the
    # provider's client and every extension module to be compiled by the run itself.
    p = scripted_provider([Reply("done")])
    cache = tmp_path / "cache"
    pi = find_pi()
    subprocess.run(
        [str(pi.node.resolve()), str(pi.cli.resolve()), "--version"],
        env={"NODE_COMPILE_CACHE": str(cache)},
        capture_output=True,
        check=True,
    )
    names = {url.rsplit("/", 1)[-1] for url in compiled(one_run(tmp_path, p.url, cache))}
    assert {"jiti.cjs", "keys.js", "tools.js"} <= names, names
    assert any(n.startswith("openai-completions-") for n in names), names


def test_the_modules_step_compiles_modules_without_running_them(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    module = tmp_path / "side.mjs"
    module.write_text(
        'import { writeFileSync } from "node:fs";\n'
        'import "./dep.mjs";\n'
        f"writeFileSync({str(mark)!r}, 'top level ran');\n"
    )
    (tmp_path / "dep.mjs").write_text(f"throw new Error('dep ran at {tmp_path}');\n")
    cache = tmp_path / "cache"
    node = str(find_pi().node)
    done = subprocess.run(
        [node, str(WARM_SCRIPT), str(module)],
        env={"NODE_COMPILE_CACHE": str(cache), **DEBUG},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not mark.exists()
    written = re.findall(r"writing cache for (\S+) to", done.stderr)
    assert {module.as_uri(), (tmp_path / "dep.mjs").as_uri()} <= set(written), written
    # The same module imported is run (the control for the file's absence above).
    ran = subprocess.run([node, str(module)], capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0
    assert "dep ran" in ran.stderr


def test_a_bad_command_line_is_refused_saying_how_to_call_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(find_pi().node), str(WARM_SCRIPT), "--require", "jiti", str(tmp_path / "x.mjs")],
        env={"NODE_COMPILE_CACHE": str(tmp_path / "cache"), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "usage: warm.js [--require NAME --from FILE] MODULE..." in done.stderr


def test_a_pi_outside_its_bundle_warms_only_the_modules_that_exist(tmp_path: Path) -> None:
    # TETHER_PI may name another entry (dist/cli.js): no index.js or chunks beside it.
    entry = tmp_path / "dist" / "cli.js"
    entry.parent.mkdir()
    entry.write_text("")
    pi = msgspec.structs.replace(find_pi(), cli=entry)
    modules = warm_modules(pi, ["openai-completions"])
    assert modules, "tether's own modules are still warmed"
    assert all(p.is_file() and p.parent == EXTENSION_DIR for p in modules), modules
    assert WARM_SCRIPT not in modules
    found = warm_modules(find_pi(), ["openai-completions", "../x", "a b"])
    names = [p.name for p in found]
    assert "index.js" in names
    assert sum(n.startswith("openai-completions-") for n in names) == 1, names
    assert all(p.is_file() for p in found)
