"""What the tests share: the ``tether`` program as a subprocess (:mod:`support.cli`), a
``tether.toml`` builder (:mod:`support.config`), a wait for a condition with a deadline
(:mod:`support.wait`), filesystems a test makes (:mod:`support.fs`) and the scripted provider
(``tests/provider.py``, every name of it), re-exported; the service's test config
(:mod:`support.service`), lines of a session file (:mod:`support.interchange`), the next
follow-up view (:mod:`support.views`), Chromium (:mod:`support.browser`), an in-memory span
exporter (:mod:`support.spans`) and a socket served in a thread (:mod:`support.net`) by module."""

from __future__ import annotations

import provider
from provider import *  # noqa: F403  (the scripted provider, re-exported whole)
from support.cli import TETHER, context_args, one_line_error, run_args, start_tether, tether
from support.config import config_text, load_test_config, workspace_tree, write_config
from support.fs import files_under, read_only, tmpfs
from support.wait import wait_for, wait_for_async

__all__ = [
    *provider.__all__,
    "TETHER",
    "config_text",
    "context_args",
    "files_under",
    "load_test_config",
    "one_line_error",
    "read_only",
    "run_args",
    "start_tether",
    "tether",
    "tmpfs",
    "wait_for",
    "wait_for_async",
    "workspace_tree",
    "write_config",
]
