"""``tether demo``: what ``make demo`` shows, for an installed tether (a pipx user has no
Makefile)."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli.exits import command

__all__ = ["demo"]


@command
def demo(
    example: Annotated[
        bool,
        typer.Option(
            "--example", help="Show the bundled example session instead (no model needed)."
        ),
    ] = False,
) -> None:
    """Show tether's main job on the embedded local model, step by step (the local extra).

    It works in .tether/demo under the current directory. Without the `local` extra
    (`pipx install 'tether[local]'`), --example shows a recorded session instead.

    Example: tether demo --example
    """
    from tether import demo as shown

    shown.main(["--example"] if example else [])
