"""``tether serve`` and ``tether worker``."""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from tether.cli.common import ConfigOpt, LedgerOpt, open_configured_ledger
from tether.cli.counts import counted
from tether.cli.exits import command, err_console
from tether.ledger import Fence

if TYPE_CHECKING:
    import uvicorn

__all__ = ["serve", "worker"]

log = logging.getLogger("tether.service")


def _logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _exit_handing_over(handed: list[Fence]) -> None:
    """Leave at once: the runs handed over stay live in the ledger (their leases expired) for
    the next worker's reconcile; ending them here would kill their pi."""
    err_console.print(
        f"[yellow]handed over {counted(len(handed), 'live run')}:[/] "
        + ", ".join(f.run for f in handed)
    )
    os._exit(0)


def _second_signal_exits(server: uvicorn.Server) -> None:
    """uvicorn takes a second SIGTERM as it took the first (and a second Ctrl-C only cuts short
    its wait for open connections), so the drain would run to its end: a second signal exits at
    once, as ``tether worker``'s does. Live runs keep their leases (pi lives on under its keeper);
    the next reconcile takes them, as after a crash."""
    first = server.handle_exit

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        if server.should_exit:
            os._exit(1)
        first(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]


@command
def serve(
    host: Annotated[
        str | None, typer.Option("--host", help="Address to bind (default: [service] host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="Port (default: [service] port, 8080).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=0,
            help="Runs executed at once inside this process (0: none; default 1 on a SQLite "
            "ledger, 0 on PostgreSQL, whose workers may run on other hosts).",
        ),
    ] = None,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json), with N in-process workers.

    SIGTERM or Ctrl-C: stop taking requests and runs, let live runs finish until [service]
    drain_s, then hand the rest over (their leases) and exit; a second signal exits at once.

    Example: tether serve --workers 2        (the whole platform on one machine, SQLite)
    """
    from tether.cli.entry import loading

    # Loaded and frozen before it serves (tether.cli.entry.loading): a full collection then
    # goes through a run's objects only, not every module's (45–60 ms of CPU on the event loop
    # that the workers' runs share, once in 11 to 150 runs in the benches).
    with loading():
        import uvicorn

        from tether.service import create_app
        from tether.service.connections import bounded_http

        _logging()
        cfg, store = open_configured_ledger(config, ledger)
        url = ledger or cfg.ledger.url
        if workers is None:
            workers = 0 if url.startswith(("postgres://", "postgresql://")) else 1
        app = create_app(cfg, store, workers=workers, on_handover=_exit_handing_over)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host or cfg.service.host,
            port=cfg.service.port if port is None else port,
            lifespan="on",
            log_level="warning",
            timeout_graceful_shutdown=5,
            # A request head within head_timeout_s; at most max_connections held open.
            http=bounded_http(cfg.service.head_timeout_s, cfg.service.max_connections),
        )
    )
    _second_signal_exits(server)
    bound = (server.config.host, server.config.port)
    _say_when_started(server, bound, url, workers, len(cfg.service.tokens))
    with store:
        server.run()


def _say_when_started(
    server: uvicorn.Server, bound: tuple[str, int], ledger_url: str, workers: int, tokens: int
) -> None:
    """Once the server listens: where, on which ledger, with how many workers and tokens, and a
    warning for each thing that would leave it useless (as uvicorn and Datasette print their
    URL). On stderr: stdout stays for data."""
    import threading
    import time

    host, port = bound
    shown = f"[{host}]" if ":" in host else host
    lines = [
        f"  ledger {_without_password(ledger_url)}; {counted(workers, 'worker')} in this "
        f"process; {counted(tokens, 'token')}",
    ]
    if tokens == 0:
        lines.append(
            "  warning: no [service.tokens]: every API request is refused (401) until one is "
            "added (the README's service section; docs/cli.md, tether serve)"
        )
    if workers == 0:
        lines.append(
            "  warning: no workers in this process: queued runs wait for `tether worker` (or "
            "`tether serve --workers N`) on this ledger"
        )

    def watch() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.02)
        listening = [sock.getsockname() for s in server.servers for sock in s.sockets]
        at = listening[0][1] if listening else port  # (the port the system chose for 0)
        head = f"tether serve: http://{shown}:{at}/ (API /v1, pages /, OpenAPI /openapi.json)"
        err_console.print("\n".join([head, *lines]), markup=False, highlight=False)

    threading.Thread(target=watch, name="tether-serve-started", daemon=True).start()


def _without_password(url: str) -> str:
    """A ledger URL fit to print: a PostgreSQL password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    auth, at, host = rest.partition("@")
    user, colon, _ = auth.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}{at}{host}"


@command
def worker(
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-n", min=1, help="Runs executed at once.")
    ] = 1,
    config: ConfigOpt = None,
    ledger: LedgerOpt = None,
) -> None:
    """Claim queued runs (oldest first, one live run per session) and execute them.

    SIGTERM or Ctrl-C: stop claiming, let live runs finish until [service] drain_s, then hand
    the rest over (their leases) and exit; a second signal exits at once.

    Example: tether worker --concurrency 4
    """
    from tether.cli.entry import loading

    with loading():  # as `tether serve`
        from tether.service import Worker

        _logging()
        cfg, store = open_configured_ledger(config, ledger)
    w = Worker(store, cfg, concurrency=concurrency, on_handover=_exit_handing_over)

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def on_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        if w.stopping:
                            os._exit(1)
                        log.info("stopping: no more claims; live runs finish or are handed over")
                        w.stop()

            tg.start_soon(on_signals)
            log.info("worker %s: concurrency %d on %s", w.owner, concurrency, store.url)
            await w.run()
            tg.cancel_scope.cancel()

    with store:
        anyio.run(main)
