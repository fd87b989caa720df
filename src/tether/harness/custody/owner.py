"""Whether a newer owner holds a run (docs/architecture.md#custody, invariant 16): asked before
this harness
sends pi anything that ends or stops it (``abort``, the end of its stdin, a signal), whatever
the stop. A run another owner took over is its own, pi with it.
"""

from __future__ import annotations

import msgspec

from tether.ledger import Fence, Ledger

__all__ = ["NewerOwner", "newer_owner"]


class NewerOwner(msgspec.Struct, frozen=True):
    """The owner that took the run over from this harness."""

    run: str
    epoch: int
    owner: str | None
    """Its lease's owner (``host/pid``); None when the run has ended since (the ledger keeps
    no owner of an ended run)."""

    def describe(self, mine: int) -> str:
        who = f"owner {self.owner}" if self.owner else "another owner"
        return (
            f"run {self.run} was taken over by a newer owner ({who}, epoch {self.epoch} > "
            f"{mine}); it goes on there, and this harness left pi to it"
        )


def newer_owner(ledger: Ledger, fence: Fence) -> NewerOwner | None:
    """The owner that took the run over (its epoch is past ``fence``'s), or None. Blocking (a
    ledger read): call it in a thread."""
    lease = ledger.lease(fence.run)
    if lease is not None:
        if lease.epoch > fence.epoch:
            return NewerOwner(fence.run, lease.epoch, lease.owner)
        return None
    run = ledger.run(fence.run)
    if run is not None and run.epoch > fence.epoch:
        return NewerOwner(fence.run, run.epoch, None)
    return None
