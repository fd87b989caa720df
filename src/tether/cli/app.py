"""The ``tether`` command: a thin layer over the Python API (one module per command group)."""

from __future__ import annotations

import typer

from tether.cli import context_cmd, ledger_cmd, model_cmd, recover_cmd, run_cmd, serve_cmd

app = typer.Typer(
    name="tether",
    help="Run pi coding agents on long-lived sessions, inside a fixed context budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(ledger_cmd.ledger_app, name="ledger")
app.add_typer(ledger_cmd.session_app, name="session")
app.command("log")(ledger_cmd.log)
app.command("sessions")(ledger_cmd.sessions)
app.command("context")(context_cmd.context)
app.command("run")(run_cmd.run)
app.command("recover")(recover_cmd.recover)
app.add_typer(model_cmd.model_app, name="model")
app.command("serve")(serve_cmd.serve)
app.command("worker")(serve_cmd.worker)


def main() -> None:
    app()
