"""A ``tether.toml`` for the embedded model: one ``local`` provider on the loopback server and one
agent that uses it.

The ``compat`` flags are what pi's ``openai-completions`` client must know about
llama-cpp-python's server (``docs/models-configuration.md``, and
``../shared/notes/local-model.md``): no developer role, no ``reasoning_effort``, no ``store``,
``max_tokens`` rather than ``max_completion_tokens``, and an assistant message between tool
results and the next user message (which also keeps assistant content a string, never null).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tether.config import Config, load_config
from tether.files import private_dir, private_file
from tether.model.weights import DEFAULT_MODEL

__all__ = ["LOCAL_COMPAT", "local_config_text", "write_local_config"]

LOCAL_COMPAT: dict[str, Any] = {
    "supportsDeveloperRole": False,
    "supportsReasoningEffort": False,
    "supportsStore": False,
    "maxTokensField": "max_tokens",
    "requiresAssistantAfterToolResult": True,
}

DEMO_SYSTEM_PROMPT = (
    "You are a concise assistant helping with a small Python project. Answer in a few sentences."
)


def _toml_value(value: Any) -> str:
    # JSON strings, booleans, numbers and arrays of them are valid TOML.
    return json.dumps(value, ensure_ascii=False)


def _inline_table(values: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in values.items()) + " }"


def local_config_text(
    base_url: str,
    *,
    ledger_url: str = "sqlite:.tether/ledger.db",
    budget_bytes: int = 240_000,
    agent: str = "assistant",
    max_tokens: int = 512,
    deadline_s: float = 600,
    tools: list[str] | None = None,
    system_prompt: str = DEMO_SYSTEM_PROMPT,
    summary_max_bytes: int | None = None,
    workdir: str = "work",
) -> str:
    """The TOML text of a config whose agent ``agent`` runs on the local server at ``base_url``,
    working in ``workdir`` (beside the config: the agent's tools never see the ledger)."""
    lines = [
        "# Written by tether for the embedded local model (tether model serve).",
        "[ledger]",
        f"url = {_toml_value(ledger_url)}",
        "",
        "[followup]",
        f"budget_bytes = {budget_bytes}",
        "",
        "[providers.local]",
        f"base_url = {_toml_value(base_url)}",
        'api = "openai-completions"',
        f"context_window = {DEFAULT_MODEL.context_window}",
        f"max_tokens = {max_tokens}",
        f"compat = {_inline_table(LOCAL_COMPAT)}",
        "",
        f"[agents.{agent}]",
        'provider = "local"',
        f"model = {_toml_value(DEFAULT_MODEL.name)}",
        'effort = "off"',
        f"system_prompt = {_toml_value(system_prompt)}",
        f"tools = {_toml_value(tools if tools is not None else ['read'])}",
        f"deadline_s = {deadline_s}",
        f"workdir = {_toml_value(workdir)}",
    ]
    if summary_max_bytes is not None:
        lines.append(f"summary_max_bytes = {summary_max_bytes}")
    lines.append("")
    return "\n".join(lines)


def write_local_config(path: Path, base_url: str, **options: Any) -> Config:
    """Write :func:`local_config_text` to ``path`` and return it as loaded (so it is valid)."""
    # Private (0700, 0600) whatever the umask; a directory that exists is left as it is.
    if not path.parent.exists():
        private_dir(path.parent)
    private_file(path).write_text(local_config_text(base_url, **options), encoding="utf-8")
    config = load_config(path)
    for name in config.agents:
        if not config.workdir(name).exists():
            private_dir(config.workdir(name))
    return config
