"""The command table of ``tether --help`` (cli/app.py) against the commands themselves: every
command is listed with its own one-line help, and listing them imports none of them."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import typer

from tether.cli.app import COMMANDS, load_command


def test_every_command_is_listed_with_its_own_first_help_line() -> None:
    import importlib

    for name, (module, attr, short) in COMMANDS.items():
        obj = getattr(importlib.import_module(f"tether.cli.{module}"), attr)
        doc = obj.info.help if isinstance(obj, typer.Typer) else inspect.getdoc(obj)
        assert doc is not None, name
        assert short == doc.splitlines()[0], f"COMMANDS[{name!r}] differs from its docstring"
        assert load_command(name).name == name


def test_help_lists_every_command_and_imports_none() -> None:
    code = (
        "import sys; sys.argv = ['tether', '--help']\n"
        "from tether.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tether.cli.') and "
        "m.endswith('_cmd'))\n"
        "heavy = sorted(m for m in ('pydantic', 'anyio', 'tether.harness', 'tether.config') "
        "if m in sys.modules)\n"
        "print('LOADED', loaded, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    for name in COMMANDS:
        assert f" {name} " in done.stdout, name
    assert "LOADED [] []" in done.stdout


def test_a_commands_help_is_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether", "setup", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    assert "--prefix" in done.stdout
    assert "--install-completion" not in done.stdout, "completion belongs to `tether` itself"


def test_version_names_tether_and_the_pinned_pi_and_exits_0() -> None:
    import json
    from importlib.metadata import version
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-m", "tether", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    manifest = Path(__file__).resolve().parent.parent / "src/tether/runtime/package.json"
    pinned = json.loads(manifest.read_text())["dependencies"]["@earendil-works/pi-coding-agent"]
    assert done.stdout == f"tether {version('tether')}, pi {pinned} (pinned)\n"


def test_tether_demo_shows_the_example_session_in_the_current_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether", "demo", "--example"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "$ tether" in done.stdout, done.stdout
    assert (tmp_path / ".tether" / "demo" / "example.db").exists()
