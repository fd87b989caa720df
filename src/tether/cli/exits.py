"""Exit statuses (DESIGN §3.5) and the one place domain errors become CLI errors."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from tether.errors import (
    BadLedgerUrl,
    ConfigError,
    InterchangeError,
    SessionRefusing,
    StorageError,
    TetherError,
    UsageError,
)

__all__ = ["Exit", "err_console", "translate_errors"]

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class Exit(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    """Usage or configuration error."""
    REFUSED = 3
    """The continuation or the view was refused, or the session refuses prompts."""
    RUN_FAILED = 4


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn tether's errors into one readable line on stderr and the right exit status."""
    try:
        yield
    except ConfigError as exc:
        err_console.print(f"[bold red]configuration error:[/] {escape(_one_line(str(exc)))}")
        raise typer.Exit(Exit.USAGE) from None
    except BadLedgerUrl as exc:
        err_console.print(f"[bold red]configuration error:[/] {escape(_one_line(str(exc)))}")
        raise typer.Exit(Exit.USAGE) from None
    except InterchangeError as exc:
        err_console.print(
            f"[bold red]bad ledger file:[/] {escape(_one_line(str(exc)))}; nothing was written"
        )
        raise typer.Exit(Exit.USAGE) from None
    except UsageError as exc:
        err_console.print(f"[bold red]usage error:[/] {escape(_one_line(str(exc)))}")
        raise typer.Exit(Exit.USAGE) from None
    except SessionRefusing as exc:
        err_console.print(f"[bold red]refused:[/] {escape(_one_line(str(exc)))}")
        raise typer.Exit(Exit.REFUSED) from None
    except StorageError as exc:
        err_console.print(f"[bold red]ledger error:[/] {escape(_one_line(str(exc)))}")
        raise typer.Exit(Exit.ERROR) from None
    except TetherError as exc:
        err_console.print(f"[bold red]error:[/] {escape(_one_line(str(exc)))}")
        raise typer.Exit(Exit.ERROR) from None


def _one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text else text


def command(fn: Callable[..., None]) -> Callable[..., None]:
    """Decorator form of :func:`translate_errors` that keeps typer's view of the signature."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        with translate_errors():
            fn(*args, **kwargs)

    return wrapper


def is_tty() -> bool:
    return sys.stdout.isatty()
