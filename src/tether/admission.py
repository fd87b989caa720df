"""Request admission (docs/cli.md#tether-run), and the closed set of reasons a request or its
follow-up
view is refused.

A request is admitted before it becomes a row. Not valid UTF-8 → :class:`UsageError` (CLI exit
2); empty → the same; over ``[followup] request_max_bytes`` (default a quarter of the budget, so
a request can always be quoted whole as the next run's previous request) → :class:`Refused` with
``request_too_large`` (CLI exit 3). Nothing is written in any of these cases: the callers admit
before they touch the ledger, or start pi. This module stands below the ledger and the follow-up
view for that reason: admitting a request loads neither.
"""

from __future__ import annotations

import enum

from tether.config import FollowupConfig
from tether.errors import TetherError, UsageError

__all__ = ["RefusalReason", "Refused", "admit_request"]


class RefusalReason(enum.StrEnum):
    SOURCE_UNAVAILABLE = "source_unavailable"
    """The previous request's row (or another source the view needs) cannot be read."""
    INCOMPLETE_REQUEST = "incomplete_request"
    """The previous run's request is partial (see ``build.py``'s module docstring)."""
    PROTECTED_CONTEXT_OVER_BUDGET = "protected_context_over_budget"
    """The request, notes and summary alone do not fit the budget."""
    ACCESS_DENIED = "access_denied"
    """The requesting actor is not admitted to the previous request."""
    SESSION_REFUSING = "session_refusing"
    """The session refuses new prompts until an operator clears it."""
    REQUEST_TOO_LARGE = "request_too_large"
    """The new request is over ``[followup] request_max_bytes`` (docs/cli.md#tether-run): admitted,
    it
    could not be quoted whole as the next run's previous request."""


class Refused(TetherError):
    """A follow-up view was refused; ``reason`` is a :class:`RefusalReason`."""

    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(f"follow-up refused ({reason.value}): {detail}")
        self.reason = reason
        self.detail = detail


def admit_request(request: str | bytes, config: FollowupConfig) -> str:
    """The request as text, admitted; or :class:`UsageError` / :class:`Refused`."""
    limit = config.request_limit
    if isinstance(request, bytes):
        if len(request) > limit:
            raise _too_large(None, limit)  # a pipe is read only to limit + 1: no exact size
        try:
            text = request.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"the request is not valid UTF-8 (invalid byte at offset {exc.start}); "
                "send it as UTF-8 text"
            ) from None
    else:
        text = request
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # argv that was not UTF-8 arrives as lone surrogates (Python's surrogateescape)
        raise UsageError(
            f"the request is not valid UTF-8 (character {exc.start} is not text); "
            "send it as UTF-8 text"
        ) from None
    if not text.strip():
        raise UsageError("the request is empty")
    if size > limit:
        raise _too_large(size, limit)
    return text


def _too_large(size: int | None, limit: int) -> Refused:
    measured = f"{size} bytes, " if size is not None else ""
    return Refused(
        RefusalReason.REQUEST_TOO_LARGE,
        f"the request is {measured}over the limit of {limit} bytes ([followup] "
        "request_max_bytes; by default a quarter of budget_bytes); shorten it, or attach "
        "the material as a file the agent can read",
    )
