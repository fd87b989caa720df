"""The follow-up view the next run would get (:func:`tether.followup.build_view`), with a
config's budget and grants."""

from __future__ import annotations

from tether.config import Config
from tether.followup import FollowupView, build_view
from tether.ledger import Ledger

__all__ = ["next_view"]


def next_view(
    ledger: Ledger,
    config: Config,
    *,
    session: str = "s1",
    agent: str = "rev",
    actor: str = "user:ana",
    request: str = "And now?",
) -> FollowupView:
    """``actor``'s view of ``session`` for ``agent``'s next ``request``; a refusal fails the
    test."""
    view = build_view(
        ledger,
        session=session,
        agent=agent,
        actor=actor,
        request=request,
        config=config.followup,
        grants=config.access.grants,
    )
    assert isinstance(view, FollowupView), view
    return view
