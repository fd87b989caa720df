"""The follow-up view the next run would get (:func:`tether.followup.build_view`), with a
config's budget and grants, or within a budget with every source granted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tether.config import Config, FollowupConfig
from tether.followup import FollowupReads, FollowupView, Refusal, build_view

__all__ = ["granted_view", "next_view"]


def _view(
    ledger: FollowupReads,
    followup: FollowupConfig,
    grants: Mapping[str, Sequence[str]],
    *,
    session: str,
    agent: str,
    actor: str,
    request: str,
) -> FollowupView | Refusal:
    return build_view(
        ledger,
        session=session,
        agent=agent,
        actor=actor,
        request=request,
        config=followup,
        grants=grants,
    )


def next_view(
    ledger: FollowupReads,
    config: Config,
    *,
    session: str = "s1",
    agent: str = "rev",
    actor: str = "user:ana",
    request: str = "And now?",
) -> FollowupView:
    """``actor``'s view of ``session`` for ``agent``'s next ``request``; a refusal fails the
    test."""
    grants = config.access.grants
    where = {"session": session, "agent": agent, "actor": actor, "request": request}
    view = _view(ledger, config.followup, grants, **where)
    assert isinstance(view, FollowupView), view
    return view


def granted_view(
    ledger: FollowupReads, budget: int, *, session: str = "s1", agent: str = "rev"
) -> FollowupView | Refusal:
    """``user:ana``'s view of ``session`` within ``budget`` bytes, every source granted to her:
    what a test of the view's cut sees, admission aside."""
    followup = FollowupConfig(budget_bytes=budget)
    where = {"session": session, "agent": agent, "actor": "user:ana", "request": "and now?"}
    return _view(ledger, followup, {"user:ana": ["*"]}, **where)
