"""Where pi's tools extension reaches the harness (docs/contracts.md#recall-and-notes): a Unix
socket in the run
directory (0600) and a per-run capability token, both named to pi in its environment
(``extension/tools.ts`` reads and removes them at load).

The harness serves the channel (:class:`tether.harness.tools.ToolServer`); this module only
says where it is and what pi is told, so that pi can be started before the server listens.
"""

from __future__ import annotations

import base64
import enum
import os
from pathlib import Path

import msgspec

from tether.files import private_dir
from tether.pi.install import extension_file

__all__ = ["SOCKET_ENV", "TOKEN_ENV", "TOOLS_EXTENSION", "TOOL_NAMES", "ToolChannel", "ToolName"]

TOOLS_EXTENSION = extension_file("tools")
"""The tools extension, loaded into every run's pi (``--extension``) whatever the agent's tools."""

SOCKET_DIR = "sock"
SOCKET_ENV = "TETHER_TOOLS_SOCKET"
TOKEN_ENV = "TETHER_TOOLS_TOKEN"
# Unix socket paths are limited (108 bytes on Linux, with the NUL); a run directory deeper than
# this gets its socket in a private directory of its own under the system's temporary directory.
_MAX_SOCKET_PATH = 100
_PRIVATE_PREFIX = "tether-tools-"


class ToolName(enum.StrEnum):
    RECALL = "recall"
    NOTE = "note"


TOOL_NAMES = tuple(ToolName)
"""The tools every run's pi has, whatever the agent's ``tools`` list holds."""


class ToolChannel(msgspec.Struct, frozen=True):
    path: Path
    token: str
    private_dir: Path | None = None
    """A directory made for the socket (a run directory too deep for a socket path): the
    server removes it when it stops."""

    @classmethod
    def new(cls, run_dir: Path) -> ToolChannel:
        """A new run's channel: the socket in ``run_dir/sock`` (a directory of its own, which a
        sandbox binds in, beside the provider forwarder's socket), a fresh token."""
        # secrets.token_urlsafe(32), spelled out: importing secrets (hmac, hashlib, random)
        # would delay the start of pi, which is made right after this.
        token = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")
        path = (private_dir(run_dir / SOCKET_DIR) / "tools.sock").resolve()
        if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
            return cls(path, token)
        import tempfile

        private = Path(tempfile.mkdtemp(prefix=_PRIVATE_PREFIX))  # 0700
        return cls(private / "tools.sock", token, private)

    @classmethod
    def again(cls, path: Path, token: str) -> ToolChannel:
        """The channel a running pi was started with (a takeover serves it again): its socket
        directory, if one was made for it, is the new server's to remove."""
        made = path.parent if path.parent.name.startswith(_PRIVATE_PREFIX) else None
        return cls(path, token, made)

    @property
    def env(self) -> dict[str, str]:
        """What pi's environment needs for the extension to reach the server."""
        return {SOCKET_ENV: str(self.path), TOKEN_ENV: self.token}
