"""Options shared by the commands, and opening the configured ledger."""

from __future__ import annotations

from pathlib import Path

from tether.cli.options import ConfigOpt, LedgerOpt
from tether.config import Config, load_config
from tether.ledger import Ledger, open_ledger

__all__ = ["ConfigOpt", "LedgerOpt", "open_configured_ledger"]


def open_configured_ledger(config: Path | None, ledger_url: str | None) -> tuple[Config, Ledger]:
    cfg = load_config(config)
    return cfg, open_ledger(ledger_url or cfg.ledger.url)
