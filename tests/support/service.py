"""A ``tether.toml`` for the service's tests (a SQLite ledger, a provider nothing answers on,
one agent ``rev``, grants and bearer tokens), and the message a ledger row of theirs holds."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["service_config", "text_message"]


def text_message(role: str, text: str, timestamp: int = 1) -> dict[str, Any]:
    """A pi message of one text part (no usage, no stopReason: what a test writes itself)."""
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": timestamp}


def _quoted(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def service_config(
    tmp: Path,
    *,
    grants: dict[str, list[str]],
    tokens: dict[str, str],
    admins: list[str] | None = None,
    runs_dir: bool = False,
) -> Path:
    """Write ``tmp/tether.toml``: ``grants`` by actor, ``tokens`` (plain token -> actor, stored
    hashed as the service keeps them), ``admins`` when given, ``runs_dir`` under ``tmp`` when
    asked; the path."""
    harness = f'[harness]\nruns_dir = "{tmp}/runs"\n' if runs_dir else ""
    granted = "".join(f'"{actor}" = {_quoted(g)}\n' for actor, g in grants.items())
    service = f"[service]\nadmins = {_quoted(admins)}\n" if admins is not None else ""
    hashed = "".join(
        f'"{hashlib.sha256(t.encode()).hexdigest()}" = "{actor}"\n' for t, actor in tokens.items()
    )
    path = tmp / "tether.toml"
    path.write_text(
        f'[ledger]\nurl = "sqlite://{tmp}/ledger.db"\n{harness}'
        '[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.rev]\nprovider = "local"\nmodel = "m"\n'
        f"[access.grants]\n{granted}{service}[service.tokens]\n{hashed}"
    )
    return path
