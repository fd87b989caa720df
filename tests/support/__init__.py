"""What the tests share: the ``tether`` program as a subprocess (:mod:`support.cli`), a
``tether.toml`` builder (:mod:`support.config`), a wait for a condition with a deadline
(:mod:`support.wait`) and the scripted provider (``tests/provider.py``), re-exported."""

from __future__ import annotations

from provider import (
    Drop,
    Fail,
    RecordedRequest,
    Reply,
    ScriptedProvider,
    Stall,
    ToolCall,
    scripted_provider,
)
from support.cli import TETHER, one_line_error, run_args, tether
from support.config import config_text, load_test_config, write_config
from support.fs import read_only, tmpfs
from support.wait import wait_for, wait_for_async

__all__ = [
    "TETHER",
    "Drop",
    "Fail",
    "RecordedRequest",
    "Reply",
    "ScriptedProvider",
    "Stall",
    "ToolCall",
    "config_text",
    "load_test_config",
    "one_line_error",
    "read_only",
    "run_args",
    "scripted_provider",
    "tether",
    "tmpfs",
    "wait_for",
    "wait_for_async",
    "write_config",
]
