"""A fresh pi agent directory per run (``PI_CODING_AGENT_DIR``), generated from ``Config``.

pi writes global settings into its agent directory, so runs never share one. ``models.json``
declares the agent's provider with exactly its model (``contextWindow`` is always set: pi's
compaction thresholds depend on it); ``settings.json`` selects that model and effort, and sets
``compaction.keepRecentTokens``/``reserveTokens`` so that a continuation compaction after the run
always has something to compact (docs/operations.md#upgrading-pi). API keys are never written to
disk nor put in pi's
environment: ``models.json`` carries a placeholder, and the key reaches pi over a private channel
(:mod:`tether.pi.keys`). The directory is 0700 and its files 0600.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec

from tether.config import AgentConfig, Config, ProviderConfig, SandboxKind
from tether.errors import ConfigError
from tether.files import private_dir, private_file
from tether.sandbox.bwrap import (
    PROVIDER_ORIGIN,
    require_bwrap,
    require_forwarded_api,
    split_base_url,
)

__all__ = ["AgentDir", "merge", "pi_models", "pi_settings", "provider_keys", "write_agent_dir"]

NO_KEY = "tether-no-key"
"""pi needs some key to call a provider; local servers ignore it."""


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` (nested tables merged, everything else replaced)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def pi_models(
    name: str, provider: ProviderConfig, agent: AgentConfig, *, sandboxed: bool = False
) -> dict[str, Any]:
    base_url = provider.base_url
    if sandboxed:
        # pi connects to the placeholder origin, which its relay turns into the forwarder's
        # socket; the forwarder outside reaches the provider's origin (docs/security.md).
        base_url = PROVIDER_ORIGIN + split_base_url(base_url)[1]
    entry: dict[str, Any] = {
        "baseUrl": base_url,
        "api": provider.api,
        # A keyed provider's real key is registered by the keys extension at pi's start.
        "apiKey": NO_KEY,
        "models": [
            {
                "id": agent.model,
                "name": agent.model,
                "contextWindow": provider.context_window,
                "maxTokens": provider.max_tokens,
                "reasoning": agent.effort != "off",
                "input": ["text", "image"] if agent.images else ["text"],
                # pi prices each call with it (tether.usage): without one, every cost is 0
                **({"cost": cost} if (cost := provider.cost.to_pi()) else {}),
            }
        ],
    }
    if provider.compat:
        entry["compat"] = dict(provider.compat)
    return {"providers": {name: entry}}


def pi_settings(config: Config, provider: ProviderConfig, agent: AgentConfig) -> dict[str, Any]:
    window = provider.context_window
    keep = config.harness.keep_recent_tokens
    reserve = config.harness.reserve_tokens
    settings: dict[str, Any] = {
        "defaultProvider": agent.provider,
        "defaultModel": agent.model,
        "defaultThinkingLevel": agent.effort,
        "compaction": {
            "enabled": True,
            # pi refuses to compact a session that fits keepRecentTokens ("Nothing to
            # compact"), and a continuation checkpoint runs once the view is over the
            # follow-up budget: keep well under the budget's token estimate (bytes / 4).
            "keepRecentTokens": (
                keep
                if keep is not None
                else min(20_000, window // 4, config.followup.budget_bytes // 16)
            ),
            "reserveTokens": (
                reserve
                if reserve is not None
                else min(16_384, max(provider.max_tokens, window // 4))
            ),
        },
        "quietStartup": True,
        "enableInstallTelemetry": False,
        "enableAnalytics": False,
        "cacheWarming": "off",
        "defaultProjectTrust": "never",
    }
    return merge(settings, config.harness.pi_settings)


class AgentDir(msgspec.Struct, frozen=True):
    path: Path
    env: dict[str, str]
    """Variables the pi process needs (the agent dir)."""


def provider_keys(config: Config, agent_name: str) -> dict[str, str]:
    """The agent's provider key by provider name (empty for a provider without one), or
    ``ConfigError`` when the key's variable is not set, or ``SandboxUnavailable`` when the
    agent runs sandboxed and bubblewrap cannot be used or its provider's api cannot be forwarded
    (checked before a run writes anything)."""
    agent = config.agent(agent_name)
    provider = config.provider(agent.provider)
    if agent.sandbox is SandboxKind.BWRAP:
        require_bwrap(agent_name)
        require_forwarded_api(agent_name, provider.api)
    if not provider.api_key_env:
        return {}
    key = os.environ.get(provider.api_key_env)
    if not key:
        raise ConfigError(
            f"provider {agent.provider!r} reads its API key from ${provider.api_key_env}, "
            "which is not set; export it before `tether run`"
        )
    return {agent.provider: key}


def write_agent_dir(
    path: Path, config: Config, agent_name: str, *, sandboxed: bool = False
) -> AgentDir:
    """Create ``path`` with the run's ``models.json`` and ``settings.json`` (``sandboxed``: the
    provider reached through the sandbox's relay)."""
    agent = config.agent(agent_name)
    provider = config.provider(agent.provider)
    provider_keys(config, agent_name)  # the key must exist, though it never lands here
    env = {"PI_CODING_AGENT_DIR": str(path.resolve())}
    private_dir(path)
    for name, body in (
        ("models.json", pi_models(agent.provider, provider, agent, sandboxed=sandboxed)),
        ("settings.json", pi_settings(config, provider, agent)),
    ):
        target = private_file(path / name)
        target.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return AgentDir(path=path, env=env)
