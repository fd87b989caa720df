"""Exit statuses (docs/cli.md#tether-run) and the one place domain errors become CLI errors."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from tether.admission import Refused
from tether.errors import (
    BadLedgerUrl,
    ConfigError,
    HarnessError,
    InterchangeError,
    RecallError,
    SessionBusy,
    SessionRefusing,
    StorageError,
    TetherError,
    UsageError,
)
from tether.pi.errors import PiNotInstalled

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "ERROR_EXITS",
    "ErrorExit",
    "Exit",
    "err_console",
    "error_exit",
    "escape",
    "translate_errors",
]


class _LazyConsole:
    """A rich console made on first use: a command that prints nothing for people (``tether
    context --json``, ``tether run --json``) does not load rich at all. Data (an answer, JSON)
    goes to stdout without rich."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def _real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    # Special methods are looked up on the type, not through __getattr__: rich's Live enters
    # its console (``with console:``) at every refresh.
    def __enter__(self) -> Console:
        return self._real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._real().__exit__(*exc)


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


class ErrorExit(NamedTuple):
    """How the CLI reports an error class: the label of its one line on stderr, and the exit
    status."""

    error: type[Exception]
    label: str
    status: Exit
    after: str = ""
    """Said after the error's own message."""


# The one mapping from tether's errors to exit statuses, for every command (``tether run``'s fast
# path included, :mod:`tether.cli.entry`); docs/cli.md lists it and tests/test_docs.py checks
# that it says exactly this. The first entry the error is an instance of applies, so a class
# comes before its bases.
ERROR_EXITS: tuple[ErrorExit, ...] = (
    ErrorExit(ConfigError, "configuration error", Exit.USAGE),
    ErrorExit(BadLedgerUrl, "configuration error", Exit.USAGE),
    ErrorExit(InterchangeError, "bad ledger file", Exit.USAGE, "; nothing was written"),
    ErrorExit(UsageError, "usage error", Exit.USAGE),
    ErrorExit(RecallError, "usage error", Exit.USAGE),
    ErrorExit(PiNotInstalled, "pi is not installed", Exit.USAGE),
    ErrorExit(SessionRefusing, "refused", Exit.REFUSED),
    ErrorExit(SessionBusy, "refused", Exit.REFUSED),
    ErrorExit(Refused, "refused", Exit.REFUSED),
    ErrorExit(StorageError, "ledger error", Exit.ERROR),
    ErrorExit(HarnessError, "pi failed", Exit.RUN_FAILED),
    ErrorExit(TetherError, "error", Exit.ERROR),
)


def error_exit(exc: TetherError) -> ErrorExit:
    """The entry of :data:`ERROR_EXITS` that applies to ``exc``."""
    return next(entry for entry in ERROR_EXITS if isinstance(exc, entry.error))


def report(exc: TetherError) -> Exit:
    """Say ``exc`` in one line on stderr, as :data:`ERROR_EXITS` labels it; its exit status."""
    entry = error_exit(exc)
    err_console.print(f"[bold red]{entry.label}:[/] {escape(_one_line(str(exc)))}{entry.after}")
    return entry.status


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn tether's errors into one readable line on stderr and their exit status
    (:data:`ERROR_EXITS`).

    The status leaves as ``SystemExit``, not ``typer.Exit``: ``tether run`` runs without loading
    typer (:mod:`tether.cli.entry`), and inside a typer command it ends the command the same
    way."""
    try:
        yield
    except TetherError as exc:
        raise SystemExit(report(exc)) from None


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
