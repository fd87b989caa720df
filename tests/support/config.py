"""``tether.toml`` for a test: the usual one (a SQLite ledger in the test's directory, one
provider ``local`` on the scripted provider, one agent ``rev``), with any key changed.

    write_config(tmp, provider.url)                                  # tmp/tether.toml
    write_config(tmp, url, harness={"storage_retry_s": 5})           # a key added or changed
    write_config(tmp, url, agents={"rev": {"workdir": None}})        # a key left out

The agent's workdir is ``tmp/work``, the template of each session's workspace; a session's
tools work in :func:`workspace_tree`.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from tether.config import Config, load_config

__all__ = ["config_text", "load_test_config", "workspace_tree", "write_config"]

NO_PROVIDER = "http://127.0.0.1:9/v1"
"""A provider URL nothing answers on (port 9, discard): for runs that must not get that far."""


def defaults(tmp: Path, provider_url: str) -> dict[str, Any]:
    return {
        "ledger": {"url": f"sqlite://{tmp}/ledger.db"},
        "providers": {
            "local": {"base_url": provider_url, "context_window": 8192, "max_tokens": 1024}
        },
        "agents": {
            "rev": {"provider": "local", "model": "scripted", "deadline_s": 60, "workdir": "work"}
        },
        # pi's retries quick: a test's failing provider is retried in milliseconds
        "harness": {"runs_dir": "runs", "pi_settings": {"retry": {"baseDelayMs": 20}}},
    }


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` applied: tables merged key by key, None removes a key."""
    merged = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r} in a test config")


def _toml(table: dict[str, Any], path: tuple[str, ...] = ()) -> list[str]:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    if path and (lines or not any(isinstance(v, dict) for v in table.values())):
        lines.insert(0, "[" + ".".join(_key(p) for p in path) + "]")
    for key, value in table.items():
        if isinstance(value, dict):
            lines += ["", *_toml(value, (*path, key))]
    return lines


def config_text(tmp: Path, provider_url: str = NO_PROVIDER, **changes: Any) -> str:
    """The TOML of the usual test config with ``changes`` (a table per keyword) applied."""
    return "\n".join(_toml(_merge(defaults(tmp, provider_url), changes))).lstrip() + "\n"


def write_config(
    tmp: Path, provider_url: str = NO_PROVIDER, *, name: str = "tether.toml", **changes: Any
) -> Path:
    """Write :func:`config_text` to ``tmp/NAME`` and make ``tmp/work`` (the agent's workdir);
    the path."""
    (tmp / "work").mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text(config_text(tmp, provider_url, **changes))
    return path


def workspace_tree(tmp: Path, session: str = "s1") -> Path:
    """Where the tools of ``session``'s runs work, with the config in ``tmp`` (the workspaces
    beside it, by default): its workspace's tree, made from ``tmp/work`` at its first run."""
    from tether.pi.workspace import workspace_name

    return tmp / ".tether" / "workspaces" / workspace_name(session) / "tree"


def load_test_config(tmp: Path, provider_url: str = NO_PROVIDER, **changes: Any) -> Config:
    """:func:`write_config`, loaded as tether loads it."""
    return load_config(write_config(tmp, provider_url, **changes))
