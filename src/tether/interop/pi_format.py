"""What both directions share: where a pi entry's fields go in the ledger, and timestamps.

A pi session entry becomes one row (or rides on one) like this:

    message         → MESSAGE row, body = the AgentMessage
    custom_message  → MESSAGE row, body = the ``custom`` AgentMessage pi builds from it
    branch_summary  → MESSAGE row, body = the ``branchSummary`` AgentMessage
    compaction      → COMPACTION row (summary, covers_to, tokens_before, first_kept_entry_id …)
    custom "tether.receipt" → RECEIPT row (how an export carries a receipt, which pi has not)
    anything else   → bookkeeping: kept whole in the extra of the next row (``pi_before``), or
                      of the session when no row follows (``pi_after``)

Fields of an entry that the row body does not hold (its ISO ``timestamp``, a compaction's
``systemMessage`` and ``usage`` …) ride in the row's extra under ``pi``; the header (minus
``type`` and ``version``) in the session's extra under ``pi_header``. The ledger keeps extras
on every round trip, so an export writes the entries back as they were.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tether.pi.sessionfile import SESSION_VERSION, iso_of_ms

__all__ = [
    "AFTER_KEY",
    "BEFORE_KEY",
    "BODY_FIELDS",
    "HEADER_KEY",
    "PI_KEY",
    "RECEIPT_TYPE",
    "SESSION_VERSION",
    "iso_of_ms",
    "ms_of_iso",
]

PI_KEY = "pi"
BEFORE_KEY = "pi_before"
AFTER_KEY = "pi_after"
HEADER_KEY = "pi_header"
RECEIPT_TYPE = "tether.receipt"

# The entry fields a row (its body, entry id and seq) holds, per entry type; the rest go to
# the row's ``pi`` extra. ``parentId`` is rebuilt on export from the order of the rows.
_BASE = frozenset({"type", "id", "parentId"})
BODY_FIELDS: dict[str, frozenset[str]] = {
    "message": _BASE | {"message"},
    "custom_message": _BASE | {"customType", "content", "display", "details"},
    "branch_summary": _BASE | {"summary", "fromId"},
    "compaction": _BASE
    | {"summary", "firstKeptEntryId", "firstKeptEntryIndex", "tokensBefore", "details", "fromHook"},
    "custom": _BASE | {"customType", "data"},
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_of_iso(stamp: Any) -> int | None:
    """An ISO timestamp as Unix milliseconds (what pi's ``new Date(ts).getTime()`` gives), None
    when it is not one (pi would get NaN, which JSON writes as null)."""
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(milliseconds=1)
