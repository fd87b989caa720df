"""What the follow-up builder returns: a view (docs/contracts.md#the-follow-up-view) or a typed
refusal.

``FollowupView.messages`` are pi AgentMessages in the order the model sees them, so the harness
can write them straight into a pi session file; ``to_json()`` gives the ``tether context --json``
shape.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from tether.admission import RefusalReason, Refused

__all__ = [
    "Checkpoint",
    "FollowupView",
    "Gap",
    "GapWhy",
    "PreviousRequest",
    "Refusal",
    "RefusalReason",
    "Refused",
    "RequestMode",
    "ViewMessage",
]

SYNTHETIC_ACTOR = "tether"
"""The actor of every message tether writes itself (notices, quoted evidence, unknown results)."""


class GapWhy(enum.StrEnum):
    BUDGET = "budget"
    """Left out because it did not fit (or lies outside the bounded reads)."""
    WITHHELD = "withheld"
    """Left out because the requesting actor is not admitted to its sources."""
    READ_CAP = "read_cap"
    """Left out because the tail read's row cap stopped before it, whatever the budget."""
    ERASED = "erased"
    """No longer in the ledger: erased (``tether erase``, retention;
    docs/operations.md#erasure-and-retention). Named where
    the view's bounded reads found the seqs missing; nothing of them can be recalled."""


class RequestMode(enum.StrEnum):
    REUSED = "reused"
    """The previous request and the suffix are contiguous stored rows, taken unchanged."""
    COPIED = "copied"
    """The view is not contiguous (or was changed), so its rows are written again as copies."""


class Refusal(msgspec.Struct, frozen=True):
    reason: RefusalReason
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"status": "refused", "reason": self.reason.value, "detail": self.detail}

    def error(self) -> Refused:
        """The refusal as an exception, for callers that raise."""
        return Refused(self.reason, self.detail)


class Gap(msgspec.Struct, frozen=True):
    """An omitted seq range, both ends included."""

    first: int
    last: int
    why: GapWhy

    def to_json(self) -> dict[str, Any]:
        return {"from": self.first, "to": self.last, "why": self.why.value}


# Fields besides ``content`` that a reader of the JSON needs to follow a message.
_SHOWN_FIELDS = {
    "toolResult": ("toolCallId", "toolName", "isError"),
    "custom": ("customType",),
    "bashExecution": ("command", "output", "exitCode"),
    "assistant": ("stopReason",),
}


class ViewMessage(msgspec.Struct, frozen=True):
    role: str
    actor: str
    origin: int | None
    """The ledger seq this message came from; None for synthetic messages."""
    copied: bool
    """Written as a new row (a copy of ``origin``) rather than reused in place."""
    synthetic: bool
    """Written by tether itself (quoted evidence, notices, unknown-effects results)."""
    message: dict[str, Any]
    """The pi AgentMessage."""
    bytes: int
    """Its size (docs/contracts.md#byte-accounting): media payloads count as their length only."""
    modified: bool = False
    """The stored message was changed (media over an attachment limit became a placeholder)."""
    media_bytes: int = 0
    """Base64 media payload bytes it carries (counted against attachment limits only)."""
    sources: tuple[str, ...] = ()
    """The source obligations of the row it came from: a copy written as a new row keeps them."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "actor": self.actor,
            "origin": self.origin,
            "copied": self.copied,
            "synthetic": self.synthetic,
            "content": self.message.get("content"),
        }
        for key in _SHOWN_FIELDS.get(self.role, ()):
            if key in self.message:
                out[key] = self.message[key]
        out["bytes"] = self.bytes
        if self.modified:
            out["modified"] = True
        return out


class Checkpoint(msgspec.Struct, frozen=True):
    """The newest compaction row, read by index and quoted in the view."""

    seq: int
    bytes: int
    """Size of the quoted-summary message in the view."""
    run: str | None
    covers_to: int
    continuation: bool
    """A tether continuation checkpoint (else a compaction pi made on its own)."""
    anchors: tuple[dict[str, Any], ...] = ()
    """Its anchors (docs/cli.md#tether-eval-continuation), quoted after the summary: ``{seq, kind,
    text, exit?}``."""
    anchors_bytes: int = 0
    """Size of the quoted-anchors message in the view (0 without anchors)."""
    anchors_omitted: int = 0
    """Stored anchors the view had no room for (the oldest): named, with their range."""
    anchors_left_out: tuple[int, int] | None = None
    """The recall range reaching the anchors left out."""

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "bytes": self.bytes,
            "run": self.run,
            "covers_to": self.covers_to,
            "kind": "continuation" if self.continuation else "compaction",
        }

    def anchors_json(self) -> dict[str, Any] | None:
        """The ``anchors`` field of the view's JSON (null when the checkpoint quotes none)."""
        if not self.anchors_bytes:
            return None
        out: dict[str, Any] = {
            "bytes": self.anchors_bytes,
            "items": [dict(a) for a in self.anchors],
            "omitted": self.anchors_omitted,
        }
        if self.anchors_left_out is not None:
            out["omitted_range"] = {
                "from": self.anchors_left_out[0],
                "to": self.anchors_left_out[1],
            }
        return out


class PreviousRequest(msgspec.Struct, frozen=True):
    seq: int
    run: str
    actor: str
    mode: RequestMode
    withheld: bool = False
    """The requesting actor is not admitted to the request's sources: a stand-in (a synthetic
    user message naming the row and its actor, never its text) is in its place."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "run": self.run,
            "actor": self.actor,
            "mode": self.mode.value,
        }
        if self.withheld:
            out["withheld"] = True
        return out


class FollowupView(msgspec.Struct, frozen=True):
    session: str
    agent: str
    actor: str | None
    budget: int
    bytes: int
    """Sum of the sizes of ``messages``; never above ``budget``."""
    checkpoint: Checkpoint | None
    previous_request: PreviousRequest | None
    messages: tuple[ViewMessage, ...]
    gaps: tuple[Gap, ...]
    sources: tuple[str, ...]
    """The union of the source obligations of everything the view carries."""
    request: ViewMessage | None = None
    """The current request (``--request``): sent after ``messages``, outside the budget."""
    media_bytes: int = 0
    """Base64 media payload bytes the view carries (counted against attachment limits only)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": "ok",
            "session": self.session,
            "agent": self.agent,
            "actor": self.actor,
            "budget": self.budget,
            "bytes": self.bytes,
            "media_bytes": self.media_bytes,
            "checkpoint": self.checkpoint.to_json() if self.checkpoint else None,
            "anchors": self.checkpoint.anchors_json() if self.checkpoint else None,
            "previous_request": (
                self.previous_request.to_json() if self.previous_request else None
            ),
            "messages": [m.to_json() for m in self.messages],
            "gaps": [g.to_json() for g in self.gaps],
            "sources": list(self.sources),
        }
        if self.request is not None:
            out["request"] = self.request.to_json()
        return out
