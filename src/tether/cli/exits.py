"""Exit statuses (DESIGN §3.5) and the one place domain errors become CLI errors."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from tether.errors import (
    BadLedgerUrl,
    ConfigError,
    InterchangeError,
    SessionRefusing,
    StorageError,
    TetherError,
    UsageError,
)

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Exit", "err_console", "escape", "translate_errors"]


class _LazyConsole:
    """A rich console made on first use: a command that prints nothing for people (``tether
    context --json``, ``tether run --json``) does not load rich at all. Data (an answer, JSON)
    goes to stdout without rich."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True)
        return getattr(self._console, name)


err_console = cast("Console", _LazyConsole(stderr=True))


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class Exit(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    """Usage or configuration error."""
    REFUSED = 3
    """The continuation or the view was refused, or the session refuses prompts."""
    RUN_FAILED = 4
    TAKEN_OVER = 5
    """``tether run``: another owner took the run over (a reconcile, after this process lost
    its lease); the run goes on, or ended, there."""


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn tether's errors into one readable line on stderr and the right exit status.

    The status leaves as ``SystemExit``, not ``typer.Exit``: ``tether run`` runs without loading
    typer (:mod:`tether.cli.entry`), and inside a typer command it ends the command the same
    way."""
    try:
        yield
    except ConfigError as exc:
        err_console.print(f"[bold red]configuration error:[/] {escape(_one_line(str(exc)))}")
        raise SystemExit(Exit.USAGE) from None
    except BadLedgerUrl as exc:
        err_console.print(f"[bold red]configuration error:[/] {escape(_one_line(str(exc)))}")
        raise SystemExit(Exit.USAGE) from None
    except InterchangeError as exc:
        err_console.print(
            f"[bold red]bad ledger file:[/] {escape(_one_line(str(exc)))}; nothing was written"
        )
        raise SystemExit(Exit.USAGE) from None
    except UsageError as exc:
        err_console.print(f"[bold red]usage error:[/] {escape(_one_line(str(exc)))}")
        raise SystemExit(Exit.USAGE) from None
    except SessionRefusing as exc:
        err_console.print(f"[bold red]refused:[/] {escape(_one_line(str(exc)))}")
        raise SystemExit(Exit.REFUSED) from None
    except StorageError as exc:
        err_console.print(f"[bold red]ledger error:[/] {escape(_one_line(str(exc)))}")
        raise SystemExit(Exit.ERROR) from None
    except TetherError as exc:
        err_console.print(f"[bold red]error:[/] {escape(_one_line(str(exc)))}")
        raise SystemExit(Exit.ERROR) from None


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
