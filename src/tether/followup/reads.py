"""The narrow, bounded read API the follow-up builder may use: the ledger's
:class:`~tether.ledger.roles.ViewReads` role.

Every ledger backend satisfies it structurally (mypy checks that in :mod:`tether.ledger.roles`).
Each method reads a bounded amount whatever the session's length (invariant 9): one
session record, one latest compaction (by index), one or a few run records, one exact row, a
byte- and row-capped tail, a row-capped range and count- and byte-capped notes. Tests wrap it to
count what the builder reads.
"""

from __future__ import annotations

from tether.ledger.roles import ViewReads as FollowupReads

__all__ = ["FollowupReads"]
