"""No answer of the service names a path of the server's filesystem: the rows it serves (the API's
rows, the event stream) name the session's workspace ``<workspace>``, the run directories
``<runs>`` and an agent's working directory ``<workdir>`` instead.

pi's opening system message carries its working directory (``sections.cwd`` and the prompt's
text), and tools print paths (``pwd``, a compiler's errors), so the rows hold the server's
absolute paths. The ledger keeps them as pi wrote them (the next run's view must be faithful);
only what leaves the service is rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tether.config import Config
from tether.pi.launch import runs_dir, workspaces_dir

__all__ = ["ServerPaths"]

# After a path: the end of it (a separator, whitespace, quoting or punctuation), so that
# ``/srv/work`` never rewrites ``/srv/workshop``.
_END = r"(?=[/\s\"'`:;,)\]}>]|$)"
# One path segment: a session's workspace directory under the workspaces directory.
_SEGMENT = r"/[^/\s\"'`:;,)\]}>]+"


class ServerPaths:
    """The server's directories that rows may name, and what the service says instead."""

    def __init__(self, roots: list[tuple[str, Path, bool]]) -> None:
        """``roots``: (placeholder, directory, whether its first segment is part of the
        placeholder: a session's workspace is ``<workspace>``, whichever session's)."""
        parts: list[tuple[int, str, str]] = []
        for placeholder, directory, with_segment in roots:
            text = str(directory)
            if text == "/":  # would rewrite every path
                continue
            pattern = re.escape(text) + (_SEGMENT if with_segment else "") + _END
            parts.append((len(text) + (1 if with_segment else 0), pattern, placeholder))
        # The longest first: a workspace inside a workdir's tree is a workspace.
        parts.sort(key=lambda p: -p[0])
        self._rules = [(re.compile(pattern), placeholder) for _, pattern, placeholder in parts]
        self._any = re.compile("|".join(f"(?:{p})" for _, p, _ in parts)) if parts else None

    @classmethod
    def of(cls, config: Config) -> ServerPaths:
        roots: list[tuple[str, Path, bool]] = [
            ("<workspace>", workspaces_dir(config), True),
            ("<runs>", runs_dir(config), False),
        ]
        roots += [("<workdir>", config.workdir(name), False) for name in config.agents]
        return cls(roots)

    def text(self, value: str) -> str:
        if self._any is None or not self._any.search(value):
            return value
        for pattern, placeholder in self._rules:
            value = pattern.sub(placeholder, value)
        return value

    def scrub(self, value: Any) -> Any:
        """``value`` (JSON: dicts, lists, strings, numbers) with every server path rewritten."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value
