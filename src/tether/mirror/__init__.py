"""The mirror: pi session entries → ledger rows through fenced step writes, idempotent by pi
entry id (see :mod:`tether.mirror.mirror`)."""

from __future__ import annotations

from tether.mirror.entries import Actors
from tether.mirror.mirror import Mirror, SessionTail

__all__ = ["Actors", "Mirror", "SessionTail"]
