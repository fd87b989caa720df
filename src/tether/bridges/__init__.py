"""Chat bridges (docs/bridges.md): a chat thread is a session. ``tether bridge matrix`` runs one.

The boundary: an adapter (:mod:`tether.bridges.matrix`; Slack with slack-bolt in Socket Mode
would be the next) turns the platform's events into :class:`Inbound` messages (event id, room,
thread root, sender, text, images, whether the bot was mentioned) and posts what it is given
(:class:`Adapter`: a threaded post with an idempotency key, a typing notice). Everything about
sessions, requests, runs, refusals and the durable outbox is :class:`Bridge`'s
(:mod:`tether.bridges.core`), the same for every platform, on the ledger
(:mod:`tether.ledger.bridges`). Only the adapter imports the platform's library (an extra).
"""

from __future__ import annotations

from tether.bridges.core import (
    Adapter,
    Bridge,
    BridgeSettings,
    Control,
    Image,
    Inbound,
    PostFailed,
    RateLimited,
    split_text,
)

__all__ = [
    "Adapter",
    "Bridge",
    "BridgeSettings",
    "Control",
    "Image",
    "Inbound",
    "PostFailed",
    "RateLimited",
    "split_text",
]
