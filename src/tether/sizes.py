"""Byte accounting (docs/contracts.md#byte-accounting).

The size of a message is the length in UTF-8 of its canonical JSON (sorted keys, no spaces) with
every base64 media payload replaced by its length. Media are counted apart, against their own
attachment limits, and never consume the text budget. The harness's working view and the follow-up
view are measured by this one function.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

__all__ = ["Measure", "canonical_json", "measure", "strip_media"]


# The canonical form is the stdlib's (its bytes are stored and measured, so they never change);
# msgspec writes the same bytes about five times faster except for some numbers: floats that
# repr writes with an exponent (msgspec writes 1e16, 1.5e-7 and 0.00001 for Python's 1e+16,
# 1.5e-07 and 1e-05) and non-finite ones (msgspec: null; Python: NaN, Infinity). Whenever the
# output may hold one of those, and for whatever msgspec refuses (non-str keys, lone
# surrogates), the stdlib encodes. tests/test_sizes.py checks the two agree on any JSON value.
_STDLIB = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_MSGSPEC = msgspec.json.Encoder(order="sorted").encode
# An exponent as msgspec writes one: a digit, e, an optional sign, a digit. Searched for by its
# literal "e" and the byte after it (the regex engine scans for a literal prefix fast; a pattern
# with the digit first or an optional part is about twice as slow), then checked in full at the
# few matches (hyphenated words, hashes).
_EXPONENT_START = re.compile(rb"e[-+0-9]")
_DIGITS = frozenset(b"0123456789")


def _is_exponent(out: bytes, e: int) -> bool:
    """Whether the match at ``e`` (``e``, then a sign or a digit) is a number's exponent."""
    if e == 0 or out[e - 1] not in _DIGITS:
        return False
    if out[e + 1] in _DIGITS:
        return True
    return e + 2 < len(out) and out[e + 2] in _DIGITS  # a sign, then a digit


def _msgspec_agrees(out: bytes) -> bool:
    """False when msgspec's output may hold a number the stdlib writes differently: an exponent,
    0.0000…, or a null (which may have been NaN or an infinity). Strings that hold these only
    cost the stdlib's encoding."""
    if b"null" in out or b"0.0000" in out:
        return False
    if _EXPONENT_START.search(out) is None:
        return True
    return not any(_is_exponent(out, m.start()) for m in _EXPONENT_START.finditer(out))


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, non-ASCII kept as is (so UTF-8 length is the byte count)."""
    try:
        out = _MSGSPEC(value)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        return _STDLIB(value)  # the stdlib's answer, or its error (UnicodeEncodeError: ValueError)
    return out.decode() if _msgspec_agrees(out) else _STDLIB(value)


class Measure(msgspec.Struct, frozen=True):
    text_bytes: int
    """UTF-8 length of the canonical JSON, media payloads replaced by their lengths."""
    media_bytes: int
    """Total length of the base64 media payloads (counted against attachment limits)."""
    media_count: int


def _is_media(node: dict[str, Any]) -> bool:
    return node.get("type") == "image" and isinstance(node.get("data"), str)


def strip_media(value: Any) -> tuple[Any, int, int]:
    """Return (copy with media payloads replaced by their length, media bytes, media count)."""
    if isinstance(value, dict):
        if _is_media(value):
            data: str = value["data"]
            return {**value, "data": len(data)}, len(data), 1
        out: dict[str, Any] = {}
        total = count = 0
        for key, item in value.items():
            out[key], b, c = strip_media(item)
            total += b
            count += c
        return out, total, count
    if isinstance(value, list):
        items = []
        total = count = 0
        for item in value:
            new, b, c = strip_media(item)
            items.append(new)
            total += b
            count += c
        return items, total, count
    return value, 0, 0


def measure(value: Any, *, canonical: str | None = None) -> Measure:
    """Measure a message (or any JSON value). ``canonical`` may pass its already-built canonical
    JSON; it is reused when the value carries no media, which is the common case."""
    if canonical is None:
        canonical = canonical_json(value)
    if '"image"' not in canonical:  # cheap test: no image block, no media to strip
        size = len(canonical) if canonical.isascii() else len(canonical.encode("utf-8"))
        return Measure(size, 0, 0)
    stripped, media, count = strip_media(value)
    return Measure(len(canonical_json(stripped).encode("utf-8")), media, count)
