"""Provider keys reach pi over a private channel, never its environment, argv or a file
(docs/security.md): pi's tools inherit pi's environment, and files outlive the run.

The keys are written into a pipe before pi starts; pi inherits the read end (``pass_fds``), and
the keys extension (``extension/keys.ts``, loaded into every run that has a key) reads it once at
load, closes it, and registers each key with pi's provider registry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import msgspec

from tether.errors import ConfigError
from tether.pi.install import extension_file

__all__ = ["KEYS_EXTENSION", "KEY_FD_ENV", "KeyChannel", "key_channel"]

KEYS_EXTENSION = extension_file("keys")
KEY_FD_ENV = "TETHER_KEY_FD"
PIPE_LIMIT = 60_000
"""Written whole before pi starts, so it must fit the pipe's buffer (64 KiB on Linux)."""


class KeyChannel(msgspec.Struct, frozen=True):
    pass_fds: tuple[int, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Only the descriptor's number: never the key."""
    extensions: tuple[Path, ...] = ()


@contextmanager
def key_channel(keys: Mapping[str, str]) -> Iterator[KeyChannel]:
    """A channel carrying ``keys`` (provider name → key) for one pi process; the read end is
    closed here once pi has started (and inherited it) or failed to."""
    if not keys:
        yield KeyChannel()
        return
    # ASCII with the default separators: the sandbox's forwarder reads the key from exactly
    # this (sandbox/outside.py, without the json module).
    grants = [{"provider": p, "key": k} for p, k in keys.items()]
    data = json.dumps(grants, ensure_ascii=True, separators=(", ", ": ")).encode()
    if len(data) > PIPE_LIMIT:
        raise ConfigError(f"provider keys take {len(data)} bytes; at most {PIPE_LIMIT} fit")
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    try:
        yield KeyChannel((read,), {KEY_FD_ENV: str(read)}, (KEYS_EXTENSION,))
    finally:
        os.close(read)
