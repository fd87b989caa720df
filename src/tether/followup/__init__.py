"""The follow-up view: what the next run of an agent on a session is given
(docs/contracts.md#the-follow-up-view).

view = build_view(ledger, session="s1", agent="reviewer", actor="user:ana",
                  config=cfg.followup, grants=cfg.access.grants)
if isinstance(view, Refusal):
    ...  # view.reason, view.detail
else:
    ...  # view.messages: pi AgentMessages in the order the model sees them
"""

from __future__ import annotations

from tether.followup.build import build_view
from tether.followup.reads import FollowupReads
from tether.followup.view import (
    Checkpoint,
    FollowupView,
    Gap,
    GapWhy,
    PreviousRequest,
    Refusal,
    RefusalReason,
    Refused,
    RequestMode,
    ViewMessage,
)

__all__ = [
    "Checkpoint",
    "FollowupReads",
    "FollowupView",
    "Gap",
    "GapWhy",
    "PreviousRequest",
    "Refusal",
    "RefusalReason",
    "Refused",
    "RequestMode",
    "ViewMessage",
    "build_view",
]
