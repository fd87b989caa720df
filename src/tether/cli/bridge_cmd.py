"""``tether bridge matrix``: chat threads as sessions (docs/bridges.md)."""

from __future__ import annotations

import logging
import os
import signal
from typing import Annotated

import anyio
import typer

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.exits import command
from tether.errors import ConfigError

__all__ = ["bridge_app"]

log = logging.getLogger("tether.bridges")

bridge_app = typer.Typer(
    name="bridge",
    help="Connect a chat platform's threads to sessions (a thread is a session).",
    no_args_is_help=True,
    rich_markup_mode=None,  # help text is plain: "[bridges.matrix]" is not markup
)


@bridge_app.command("matrix")
@command
def matrix(
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=0,
            help="Runs executed at once inside this process (0: none, other workers on the "
            "ledger take them).",
        ),
    ] = 1,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Answer in Matrix threads: [bridges.matrix]'s bot, its rooms and their agents.

    The bot's access token is read from the variable [bridges.matrix] token_env names.
    SIGTERM or Ctrl-C: stop syncing, let live runs finish until [service] drain_s, post the
    answers that are ready, and exit; a second signal exits at once.

    Example: TETHER_MATRIX_TOKEN=syt_… tether bridge matrix --workers 2
    """
    from tether.cli.entry import loading

    with loading():
        from tether.bridges.matrix import serve

        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        logging.getLogger("nio").setLevel(logging.WARNING)  # a line per event it parses
        cfg, store = open_configured_ledger(config, ledger)
    found = cfg.bridges.matrix
    if found is None:
        raise ConfigError(
            f"{cfg.path or 'tether.toml'} has no [bridges.matrix] section: add its homeserver, "
            "user, token_env and rooms (docs/bridges.md)"
        )
    token = os.environ.get(found.token_env, "").strip()
    if not token:
        raise ConfigError(
            f"${found.token_env} is not set: it must hold the access token of {found.user} "
            "([bridges.matrix] token_env names the variable)"
        )

    async def main() -> None:
        stopped = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        if stopped.is_set():
                            os._exit(1)
                        log.info("stopping: no more events; live runs finish, answers posted")
                        stopped.set()

            tg.start_soon(on_signals)
            await serve(cfg, store, token=token, workers=workers, stopped=stopped)
            tg.cancel_scope.cancel()

    with store:
        try:
            anyio.run(main)
        except BaseExceptionGroup as group:
            raise _alone(group) from None


def _alone(error: BaseException) -> BaseException:
    """The one error inside nested task groups' groups (a refused token, say), so it exits
    with its own status; a group of several stays one."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
