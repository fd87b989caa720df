"""What pi announced over RPC in a run: the mirror writes a row only for an entry of pi's session
file that pi announced (docs/security.md, "Rows only from pi").

pi reports every entry that becomes a row as it writes it, in the order it writes them:

    message entry         → ``message_end`` carrying the same message
    custom_message entry  → ``message_end`` of its ``custom`` message, or ``entry_appended``
    compaction entry      → ``compaction_end`` carrying its summary, tokens and details, or
                            ``entry_appended`` (an extension's boundary compaction)
    custom entry (receipt), context_edit → ``entry_appended`` carrying the entry itself

Each announcement is kept as a fingerprint (a hash of the canonical JSON of what it carries) and
taken by the first entry that matches it, so one announcement vouches for one entry. The texts pi
puts in its steering and follow-up queues (``queue_update``) are kept too: a user message is
mirrored only as the run's request or as a text tether relayed into the run.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from tether.pi.protocol import Event
from tether.pi.sessionformat import EntryKind, entry_kind

__all__ = ["Announced", "vouched"]

_ENCODER = msgspec.json.Encoder(order="sorted")


def _key(tag: bytes, value: Any) -> bytes:
    return hashlib.blake2b(tag + _ENCODER.encode(value), digest_size=16).digest()


def _present(source: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The fields of ``source`` it has (JSON drops an undefined one: absent stays absent)."""
    return {name: source[name] for name in fields if name in source}


_CUSTOM_FIELDS = ("customType", "content", "display", "details")
_COMPACTION_FIELDS = ("summary", "tokensBefore", "details")


def vouched(entry: dict[str, Any]) -> bool:
    """Whether ``entry`` needs pi's announcement to be mirrored: one that becomes a row, and a
    context edit (it changes what an earlier entry becomes). Bookkeeping becomes nothing."""
    return entry_kind(entry) is not EntryKind.BOOKKEEPING


def _entry_keys(entry: dict[str, Any]) -> list[bytes]:
    """The fingerprints an announcement of ``entry`` may have (a ``message`` entry is only ever
    announced by its ``message_end``: pi appends no such entry with ``entry_appended``)."""
    kind = entry.get("type")
    if kind == "message":
        message = entry.get("message")
        return [_key(b"message", message)] if isinstance(message, dict) else []
    keys = [_key(b"entry", entry)]
    if kind == "custom_message":
        keys.append(_key(b"custom", _present(entry, _CUSTOM_FIELDS)))
    elif kind == "compaction":
        keys.append(_key(b"compaction", _present(entry, _COMPACTION_FIELDS)))
    return keys


class Announced:
    """The announcements of one run not yet taken by an entry (fed by the harness's follower
    with every record pi writes, in order)."""

    def __init__(self) -> None:
        self._waiting: Counter[bytes] = Counter()
        self._queued: set[str] = set()
        self._taken: list[bytes] = []
        self.heard = 0
        """How many announcements were heard."""

    def hear(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        key: bytes | None = None
        if kind == Event.MESSAGE_END:
            message = record.get("message")
            if isinstance(message, dict):
                if message.get("role") == "custom":
                    key = _key(b"custom", _present(message, _CUSTOM_FIELDS))
                else:
                    key = _key(b"message", message)
        elif kind == Event.COMPACTION_END:
            result = record.get("result")
            if isinstance(result, dict):
                key = _key(b"compaction", _present(result, _COMPACTION_FIELDS))
        elif kind == Event.ENTRY_APPENDED:
            entry = record.get("entry")
            if isinstance(entry, dict):
                key = _key(b"entry", entry)
        elif kind == Event.QUEUE_UPDATE:
            for name in ("steering", "followUp"):
                queue = record.get(name)
                if isinstance(queue, list):
                    self._queued.update(text for text in queue if isinstance(text, str))
        if key is not None:
            self._waiting[key] += 1
            self.heard += 1

    def has(self, entry: dict[str, Any]) -> bool:
        """Whether an announcement not yet taken matches ``entry``."""
        return any(self._waiting[key] > 0 for key in _entry_keys(entry))

    def take(self, entry: dict[str, Any]) -> bool:
        """Take the announcement of ``entry``, if pi made one (and no entry took it before)."""
        for key in _entry_keys(entry):
            if self._waiting[key] > 0:
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]
                self._taken.append(key)
                return True
        return False

    def queued(self, text: str) -> bool:
        """Whether pi put ``text`` in its steering or follow-up queue (a relayed request)."""
        return text in self._queued

    def begin(self) -> None:
        """A mirror pass begins: what it takes can be given back (:meth:`give_back`)."""
        self._taken.clear()

    def give_back(self) -> None:
        """The pass failed (nothing it read was stored): what it took is there to take again,
        beside what was heard meanwhile."""
        self._waiting.update(self._taken)
        self._taken.clear()
