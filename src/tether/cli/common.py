"""Options shared by the commands, and opening the configured ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.config import Config, load_config
from tether.ledger import Ledger, open_ledger

__all__ = ["ConfigOpt", "LedgerOpt", "open_configured_ledger"]

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="tether.toml to use (default: $TETHER_CONFIG or ./tether.toml)."
    ),
]
LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger", help="Ledger URL, overriding the config (memory:, sqlite:PATH, postgresql://…)."
    ),
]


def open_configured_ledger(config: Path | None, ledger_url: str | None) -> tuple[Config, Ledger]:
    cfg = load_config(config)
    return cfg, open_ledger(ledger_url or cfg.ledger.url)
