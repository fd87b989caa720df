"""Configuration (DESIGN §3.4): ``tether.toml``, found by ``--config PATH`` or ``TETHER_CONFIG``.

Every section is optional; a missing file means the defaults (an embedded SQLite ledger in
``.tether/ledger.db`` and no agents). Unknown keys are errors, so a typo never silently does
nothing.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tether.errors import ConfigError

__all__ = [
    "DEFAULT_BUDGET",
    "AccessConfig",
    "AgentConfig",
    "Config",
    "CustodyConfig",
    "FollowupConfig",
    "HarnessConfig",
    "LedgerConfig",
    "ProviderConfig",
    "ServiceConfig",
    "load_config",
]

DEFAULT_BUDGET = 240_000
DEFAULT_LEDGER_URL = "sqlite:.tether/ledger.db"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LedgerConfig(_Section):
    url: str = DEFAULT_LEDGER_URL


class FollowupConfig(_Section):
    budget_bytes: int = Field(DEFAULT_BUDGET, gt=0)
    notes_max_count: int = Field(32, ge=0)
    notes_max_bytes: int = Field(16_000, ge=0)
    media_max_bytes: int = Field(5_000_000, ge=0)
    """Attachment limit for one top-level media payload (base64 bytes)."""
    tool_media_max_bytes: int = Field(1_000_000, ge=0)
    """Attachment limit for one media payload inside a tool result (base64 bytes)."""
    media_max_total_bytes: int = Field(20_000_000, ge=0)
    """Attachment limit for all media of one view together."""


class ProviderConfig(_Section):
    base_url: str
    api: str = "openai-completions"
    api_key_env: str | None = None
    context_window: int = Field(128_000, gt=0)
    max_tokens: int = Field(4096, gt=0)
    compat: dict[str, Any] = Field(default_factory=dict)
    """Passed through to pi's models.json ``compat`` for this provider's models."""


class AgentConfig(_Section):
    provider: str
    model: str
    effort: Literal["off", "minimal", "low", "medium", "high", "xhigh"] = "off"
    system_prompt: str | None = None
    tools: list[str] = Field(default_factory=lambda: ["read", "bash"])
    deadline_s: float = Field(600, gt=0)
    checkpoint_min_time_s: float = Field(30, ge=0)
    """A checkpoint is attempted only when at least this much of the deadline remains."""
    summary_max_bytes: int = Field(60_000, gt=0)
    """A continuation summary over this many bytes is refused (``over_bound``); the bound is
    capped at a quarter of the follow-up budget, so the next view can always hold it."""


class HarnessConfig(_Section):
    runs_dir: Path | None = None
    """Where each run keeps its pi agent dir, session file and log (default: ``.tether/runs``
    beside the config file, or in the working directory)."""
    stop_grace_s: float = Field(5, gt=0)
    """How long a stop waits for pi to settle after ``abort``, and for it to exit after its
    stdin closes, before escalating."""
    keep_recent_tokens: int | None = Field(None, ge=0)
    """pi's ``compaction.keepRecentTokens`` (default: min(20000, context_window / 4,
    followup.budget_bytes / 16), so a continuation checkpoint always has something to compact)."""
    reserve_tokens: int | None = Field(None, ge=0)
    """pi's ``compaction.reserveTokens`` (default: min(16384, max(max_tokens, window / 4)))."""
    pi_settings: dict[str, Any] = Field(default_factory=dict)
    """Merged (deeply) into every run's pi ``settings.json``,
    e.g. ``{retry = {baseDelayMs = 500}}``."""


class CustodyConfig(_Section):
    """Session custody (DESIGN §3.7)."""

    lease_s: float = Field(30, gt=0)
    """A live run's lease lasts this long after its last heartbeat (heartbeats come every
    third of it)."""
    detached: bool = True
    """pi runs detached from the harness under a keeper (commands through a FIFO, events to a
    file, both in the run directory), so a run outlives a lost harness. Off: pi is the
    harness's child and dies with it."""
    wait_poll_s: float = Field(0.2, gt=0)
    """How often a waiting ``tether run`` asks whether its turn has come."""


class AccessConfig(_Section):
    grants: dict[str, list[str]] = Field(default_factory=dict)
    """actor -> source patterns (fnmatch) it is admitted to."""


class ServiceConfig(_Section):
    """``tether serve`` and ``tether worker`` (DESIGN §3.8)."""

    tokens: dict[str, str] = Field(default_factory=dict)
    """SHA-256 hex of a bearer token -> the actor its requests act as (``"…hex…" = "user:ana"``)."""
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    poll_s: float = Field(0.2, gt=0)
    """How often an idle worker looks for queued runs (and a stream for new rows)."""
    drain_s: float = Field(30, ge=0)
    """On SIGTERM, how long live runs may go on before they are handed over (lease released)."""
    relay_wait_s: float = Field(5, ge=0)
    """How long a ``steer``/``follow_up`` request waits for the worker holding the live run to
    take it before it is answered as queued (it then becomes the session's next run)."""

    @field_validator("tokens")
    @classmethod
    def _digests(cls, tokens: dict[str, str]) -> dict[str, str]:
        for digest in tokens:
            if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
                raise ValueError(
                    f"key {digest[:12]!r}… is not the SHA-256 hex of a token (64 lowercase hex "
                    "characters: `printf %s TOKEN | sha256sum`)"
                )
        return tokens


class Config(_Section):
    ledger: LedgerConfig = LedgerConfig()
    followup: FollowupConfig = FollowupConfig()
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    access: AccessConfig = AccessConfig()
    harness: HarnessConfig = HarnessConfig()
    custody: CustodyConfig = CustodyConfig()
    service: ServiceConfig = ServiceConfig()
    path: Path | None = None
    """Where this configuration was read from (None for the defaults)."""

    def agent(self, name: str) -> AgentConfig:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise ConfigError(
                f"unknown agent {name!r} (configured: {known}); add [agents.{name}] to "
                f"{self.path or 'tether.toml'}"
            ) from None

    def provider(self, name: str) -> ProviderConfig:
        try:
            return self.providers[name]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            raise ConfigError(
                f"unknown provider {name!r} (configured: {known}); add [providers.{name}] to "
                f"{self.path or 'tether.toml'}"
            ) from None


def load_config(path: str | Path | None = None) -> Config:
    """Read the configuration from ``path``, else ``$TETHER_CONFIG``, else ``./tether.toml`` if it
    exists, else the defaults."""
    explicit = path is not None or "TETHER_CONFIG" in os.environ
    chosen = Path(path or os.environ.get("TETHER_CONFIG") or "tether.toml")
    if not chosen.exists():
        if explicit:
            raise ConfigError(f"config file {chosen} does not exist")
        return Config()
    try:
        data = tomllib.loads(chosen.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {chosen}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{chosen}: invalid TOML: {exc}") from exc
    try:
        config = Config.model_validate({**data, "path": chosen.resolve()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{chosen}: {problems}") from exc
    for name, agent in config.agents.items():
        if agent.provider not in config.providers:
            raise ConfigError(
                f"{chosen}: agents.{name}.provider = {agent.provider!r} names no [providers.…] "
                "section"
            )
    return config
