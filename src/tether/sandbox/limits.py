"""Which sandbox limit a tool hit (docs/security.md): read from the tool's result, kept in the
run's record as ``extra.limits_hit``.

A process over ``[agents.X] limits`` is not stopped by tether: the kernel refuses it (a fork,
an allocation, a write), and the tool reports the refusal as its result. What names the limit
is in that result, most exactly first:

- the exit status pi's bash tool reports (``Command exited with code 153``: the shell was
  ended by ``SIGXFSZ``, 128 + 25), and the errno names Node puts in pi's write and edit
  tools' errors (``EFBIG: file too large``);
- what the C library, the shell and the common runtimes print for the refused call:
  ``strerror`` of ``EAGAIN``/``ENOMEM``/``EFBIG``/``ENOSPC``, bash's name of ``SIGXFSZ``
  ("File size limit exceeded"), Python's ``MemoryError``, C++'s ``std::bad_alloc``, "out of
  memory", "memory exhausted".

Only the tools that run commands or write files in the sandbox are read (``bash``, ``write``,
``edit``): ``read``, ``grep``, ``find`` and ``ls`` show what files hold, and ``recall`` what
the ledger holds, so such words there name no failure. "No space left on device" counts only
where the result or the call names ``/tmp`` (the sandbox's ``/tmp`` is memory, capped at the
file size limit; the workdir's disk filling up is not a limit of the run). A tool that prints
these words for another reason (``cat`` of a log that holds them) is recorded too: the record
says what the tool's result shows, with the evidence it matched.
"""

from __future__ import annotations

import enum
import json
import re
import signal
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = [
    "LIMIT_TOOLS",
    "MAX_PER_LIMIT",
    "LimitHit",
    "LimitWatch",
    "SandboxLimit",
    "limits_in",
    "limits_text",
    "recorded_limits",
]

LIMIT_TOOLS = frozenset({"bash", "write", "edit"})
"""The tools whose results are read: pi's tools that run commands or write files."""
MAX_PER_LIMIT = 10
"""The record keeps the first this-many hits of each limit (a fork bomb hits it all along)."""


class SandboxLimit(enum.StrEnum):
    """A limit of ``[agents.X] limits``, as the run's record names it."""

    PROCESSES = "processes"
    """``limits.processes`` (``RLIMIT_NPROC``): a fork or a new thread refused (``EAGAIN``)."""
    MEMORY = "memory"
    """``limits.memory_bytes`` (``RLIMIT_DATA``): an allocation refused (``ENOMEM``)."""
    FILE_SIZE = "file_size"
    """``limits.file_size_bytes`` (``RLIMIT_FSIZE``, and the size of the sandbox's ``/tmp``):
    a write refused (``SIGXFSZ``, ``EFBIG``; ``ENOSPC`` in ``/tmp``)."""


class LimitHit(msgspec.Struct, frozen=True, kw_only=True):
    """One tool result that shows a limit hit: ``extra.limits_hit`` holds a list of these."""

    limit: SandboxLimit
    tool: str
    """The tool's name (``bash``, ``write``, ``edit``)."""
    seq: int
    """The ledger seq of the tool's result row."""
    evidence: str
    """What in the result names the limit: one of the fixed labels below, never its text."""


_XFSZ_STATUS = 128 + int(signal.SIGXFSZ)
_EXIT = re.compile(r"(?:^Command exited with code|\. The shell exited with code) (\d+)\b")
"""pi's bash tool's last line: its exit status (or, at a timeout, the shell's)."""
_TMP = re.compile(r"(?<![\w.~-])/tmp(?![\w.-])")

# (limit, evidence label, pattern): the first pattern of a limit that matches is its evidence.
_SIGNS: tuple[tuple[SandboxLimit, str, re.Pattern[str]], ...] = (
    (SandboxLimit.FILE_SIZE, "EFBIG", re.compile(r"\bEFBIG\b")),
    (
        SandboxLimit.FILE_SIZE,
        "SIGXFSZ (File size limit exceeded)",
        re.compile(r"File size limit exceeded"),
    ),
    (SandboxLimit.FILE_SIZE, "EFBIG (File too large)", re.compile(r"\bFile too large\b")),
    (SandboxLimit.MEMORY, "ENOMEM", re.compile(r"\bENOMEM\b")),
    (SandboxLimit.MEMORY, "ENOMEM (Cannot allocate memory)", re.compile(r"Cannot allocate memory")),
    (SandboxLimit.MEMORY, "MemoryError", re.compile(r"^\s*MemoryError\b", re.MULTILINE)),
    (SandboxLimit.MEMORY, "std::bad_alloc", re.compile(r"std::bad_alloc")),
    (SandboxLimit.MEMORY, "out of memory", re.compile(r"\bout of memory\b", re.IGNORECASE)),
    (SandboxLimit.MEMORY, "memory exhausted", re.compile(r"\bmemory exhausted\b")),
    (SandboxLimit.MEMORY, "xmalloc", re.compile(r"\bxmalloc: .*cannot allocate")),
    (SandboxLimit.PROCESSES, "EAGAIN", re.compile(r"\bEAGAIN\b")),
    (
        SandboxLimit.PROCESSES,
        "EAGAIN (Resource temporarily unavailable)",
        re.compile(r"Resource temporarily unavailable"),
    ),
    (SandboxLimit.PROCESSES, "Cannot fork", re.compile(r"\bCannot fork\b", re.IGNORECASE)),
    (SandboxLimit.PROCESSES, "can't start new thread", re.compile(r"can't start new thread")),
)
_NO_SPACE = re.compile(r"No space left on device|\bENOSPC\b")


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def limits_in(message: Mapping[str, Any], call: str = "") -> list[tuple[SandboxLimit, str]]:
    """The limits a ``toolResult`` message shows hit, each with its evidence (in the order of
    :class:`SandboxLimit`); ``call`` is the call's arguments as text, where ``/tmp`` may be
    named. Nothing for another role or a tool outside :data:`LIMIT_TOOLS`."""
    if message.get("role") != "toolResult" or message.get("toolName") not in LIMIT_TOOLS:
        return []
    text = _text(message)
    found: dict[SandboxLimit, str] = {}
    lines = text.rstrip().splitlines()
    status = _EXIT.search(lines[-1].strip()) if lines and message.get("isError") else None
    if status is not None and int(status.group(1)) == _XFSZ_STATUS:
        found[SandboxLimit.FILE_SIZE] = f"exit status {_XFSZ_STATUS} (SIGXFSZ)"
    for limit, label, pattern in _SIGNS:
        if limit not in found and pattern.search(text):
            found[limit] = label
    in_tmp = _TMP.search(text) is not None or _TMP.search(call) is not None
    if SandboxLimit.FILE_SIZE not in found and in_tmp and _NO_SPACE.search(text):
        found[SandboxLimit.FILE_SIZE] = "ENOSPC in /tmp (No space left on device)"
    return [(limit, found[limit]) for limit in SandboxLimit if limit in found]


class LimitWatch:
    """The limits one run's tools hit, from the rows its mirror writes (each row once, by seq:
    a mirror that writes a row again after a failed pass sees it again)."""

    def __init__(self) -> None:
        self._calls: dict[str, str] = {}
        self._seen: set[tuple[int, SandboxLimit]] = set()
        self.hits: list[LimitHit] = []

    def see(self, seq: int, body: Mapping[str, Any]) -> None:
        role = body.get("role")
        if role == "assistant":
            # A result follows its call: the latest assistant message's calls are enough.
            content = body.get("content")
            self._calls = {
                str(part.get("id")): json.dumps(part.get("arguments"), ensure_ascii=False)
                for part in (content if isinstance(content, list) else [])
                if isinstance(part, dict) and part.get("type") == "toolCall"
            }
            return
        if role != "toolResult":
            return
        call = self._calls.get(str(body.get("toolCallId")), "")
        for limit, evidence in limits_in(body, call):
            if (seq, limit) in self._seen:
                continue
            self._seen.add((seq, limit))
            if sum(hit.limit is limit for hit in self.hits) >= MAX_PER_LIMIT:
                continue
            tool = str(body.get("toolName"))
            self.hits.append(LimitHit(limit=limit, tool=tool, seq=seq, evidence=evidence))


def recorded_limits(extra: Mapping[str, Any]) -> list[LimitHit]:
    """The limits a run's record names (``extra.limits_hit``); empty when it names none."""
    found = extra.get("limits_hit")
    if not isinstance(found, list):
        return []
    out: list[LimitHit] = []
    for item in found:
        try:
            out.append(msgspec.convert(item, LimitHit))
        except msgspec.ValidationError:
            continue
    return out


def limits_text(extra: Mapping[str, Any]) -> str | None:
    """``file_size (bash at seq 4, edit at seq 12); memory (bash at seq 9)`` for a run whose
    record names limits hit; None for one that names none."""
    hits = recorded_limits(extra)
    if not hits:
        return None
    parts = []
    for limit in SandboxLimit:
        where = [f"{h.tool} at seq {h.seq}" for h in hits if h.limit is limit]
        if where:
            parts.append(f"{limit.value} ({', '.join(where)})")
    return "; ".join(parts)
