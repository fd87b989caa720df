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

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from tether.errors import ConfigError

__all__ = [
    "DEFAULT_BUDGET",
    "AccessConfig",
    "AgentConfig",
    "Config",
    "FollowupConfig",
    "HarnessConfig",
    "LedgerConfig",
    "ProviderConfig",
    "load_config",
    "parse_config",
]

DEFAULT_BUDGET = 240_000
DEFAULT_LEDGER_URL = "sqlite:.tether/ledger.db"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LedgerConfig(_Section):
    url: str = DEFAULT_LEDGER_URL


class FollowupConfig(_Section):
    budget_bytes: StrictInt = Field(DEFAULT_BUDGET, gt=0)
    notes_max_count: StrictInt = Field(32, ge=0)
    notes_max_bytes: StrictInt = Field(16_000, ge=0)
    media_max_bytes: StrictInt = Field(5_000_000, ge=0)
    """Attachment limit for one top-level media payload (base64 bytes)."""
    tool_media_max_bytes: StrictInt = Field(1_000_000, ge=0)
    """Attachment limit for one media payload inside a tool result (base64 bytes)."""
    media_max_total_bytes: StrictInt = Field(20_000_000, ge=0)
    """Attachment limit for all media of one view together."""
    request_max_bytes: StrictInt | None = Field(None, gt=0)
    """The largest request a run admits, in UTF-8 bytes (default: a quarter of the budget, so
    the request can always be quoted whole as the next run's previous request)."""

    @property
    def request_limit(self) -> int:
        return self.request_max_bytes or max(1, self.budget_bytes // 4)


class ProviderConfig(_Section):
    base_url: str
    api: str = "openai-completions"
    api_key_env: str | None = None
    context_window: StrictInt = Field(128_000, gt=0)
    max_tokens: StrictInt = Field(4096, gt=0)
    compat: dict[str, Any] = Field(default_factory=dict)
    """Passed through to pi's models.json ``compat`` for this provider's models."""


class AgentConfig(_Section):
    provider: str
    model: str
    effort: Literal["off", "minimal", "low", "medium", "high", "xhigh"] = "off"
    system_prompt: str | None = None
    tools: list[str] = Field(default_factory=lambda: ["read", "bash"])
    deadline_s: StrictFloat = Field(600, gt=0)
    checkpoint_min_time_s: StrictFloat = Field(30, ge=0)
    """A checkpoint is attempted only when at least this much of the deadline remains."""
    summary_max_bytes: StrictInt = Field(60_000, gt=0)
    """A continuation summary over this many bytes is refused (``over_bound``); the bound is
    capped at a quarter of the follow-up budget, so the next view can always hold it."""
    workdir: Path | None = None
    """Where the agent's tools run (relative to the config file; default: the current
    directory). It must not contain the ledger file, the config or the run directories."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables the agent's tools get, besides PATH, HOME, LANG, TERM and a private TMPDIR."""


class HarnessConfig(_Section):
    runs_dir: Path | None = None
    """Where each run keeps its pi agent dir, session file and log (default: ``.tether/runs``
    beside the config file, or in the working directory)."""
    stop_grace_s: StrictFloat = Field(5, gt=0)
    """How long a stop waits for pi to settle after ``abort``, and for it to exit after its
    stdin closes, before escalating."""
    keep_recent_tokens: StrictInt | None = Field(None, ge=0)
    """pi's ``compaction.keepRecentTokens`` (default: min(20000, context_window / 4,
    followup.budget_bytes / 16), so a continuation checkpoint always has something to compact)."""
    reserve_tokens: StrictInt | None = Field(None, ge=0)
    """pi's ``compaction.reserveTokens`` (default: min(16384, max(max_tokens, window / 4)))."""
    storage_retry_s: StrictFloat = Field(30, ge=0)
    """How long a run keeps retrying ledger writes that failed (a full disk, a lost connection)
    before it ends with the error, naming where its answer is kept."""
    pi_settings: dict[str, Any] = Field(default_factory=dict)
    """Merged (deeply) into every run's pi ``settings.json``,
    e.g. ``{retry = {baseDelayMs = 500}}``."""


class AccessConfig(_Section):
    grants: dict[str, list[str]] = Field(default_factory=dict)
    """actor -> source patterns (fnmatch) it is admitted to."""


class Config(_Section):
    ledger: LedgerConfig = LedgerConfig()
    followup: FollowupConfig = FollowupConfig()
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    access: AccessConfig = AccessConfig()
    harness: HarnessConfig = HarnessConfig()
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

    def workdir(self, name: str) -> Path:
        """The agent's working directory, resolved (relative to the config file)."""
        chosen = self.agent(name).workdir
        if chosen is None:
            return Path.cwd().resolve()
        base = self.path.parent if self.path else Path.cwd()
        return (chosen if chosen.is_absolute() else base / chosen).resolve()

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
    try:
        exists = chosen.exists()
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long
        raise ConfigError(f"cannot use config path {str(chosen)!r}: {exc}") from exc
    if not exists:
        if explicit:
            raise ConfigError(f"config file {chosen} does not exist")
        return Config()
    try:
        raw = chosen.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {chosen}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{chosen}: not UTF-8 text (invalid byte at offset {exc.start})") from exc
    return parse_config(text, chosen)


def parse_config(text: str, chosen: Path) -> Config:
    """The configuration in ``text`` (read from ``chosen``), or :class:`ConfigError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{chosen}: invalid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{chosen}: invalid TOML: arrays or tables nest too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"{chosen}: invalid TOML value: {exc}") from exc
    try:
        config = Config.model_validate({**data, "path": chosen.resolve()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            + (f" (not {_toml_type(err['input'])})" if err["type"].endswith("_type") else "")
            for err in exc.errors()
        )
        raise ConfigError(f"{chosen}: {' '.join(problems.split())}") from exc
    except RecursionError:
        raise ConfigError(f"{chosen}: values nest too deeply") from None
    for name, agent in config.agents.items():
        if agent.provider not in config.providers:
            raise ConfigError(
                f"{chosen}: agents.{name}.provider = {agent.provider!r} names no [providers.…] "
                "section"
            )
    return config


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    return names.get(type(value), "an array" if isinstance(value, list) else "a table")
