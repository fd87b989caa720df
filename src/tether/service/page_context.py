"""The context objects of the pages (Datasette's way): each page renders exactly one of these,
and its JSON twin returns the same object. Every field says what it holds (``help``); a test
checks that every key is documented and that the JSON twin has them all."""

# ruff: noqa: RUF009  (doc() returns a dataclasses.field: no shared default is evaluated)

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BudgetPart",
    "ErrorPage",
    "IndexPage",
    "LoginPage",
    "NextPage",
    "RunHeader",
    "SearchPage",
    "SessionLine",
    "TimelinePage",
]


def doc(text: str, **kw: Any) -> Any:
    """A field with its help text (``metadata["help"]``)."""
    return field(metadata={"help": text}, **kw)


@dataclass(frozen=True, slots=True)
class LoginPage:
    next: str = doc("Where the login goes once the token is accepted (a path on this site).")
    error: str | None = doc("Why the last token (or the post itself) was refused, or null.")
    form_token: str = doc(
        "The form's token: the same value as the form cookie this page sets, sent back with "
        "the form (a page of another site can neither read the cookie nor know the value)."
    )


@dataclass(frozen=True, slots=True)
class SessionLine:
    session: str = doc("The session id.")
    created: str = doc("When the session was created (UTC, ISO 8601).")
    state: str = doc("running, queued, idle or refusing.")
    refusing: str | None = doc("Why the session refuses new prompts, or null.")
    last_seq: int = doc("The seq of its newest row (0: none yet).")
    runs: int = doc("How many runs it has, in every status.")
    counts: dict[str, int] = doc("Runs by status: queued, running, finished, failed, interrupted.")


@dataclass(frozen=True, slots=True)
class IndexPage:
    actor: str = doc("The caller's actor (its token's).")
    sessions: list[SessionLine] = doc("The sessions the caller may see, newest first.")
    shown_at_most: int = doc("How many of the newest sessions are read at most.")


@dataclass(frozen=True, slots=True)
class RunHeader:
    run: str = doc("The run id.")
    agent: str = doc("The agent it runs.")
    status: str = doc("queued, running, finished, failed or interrupted.")
    started: str | None = doc("When it started (UTC, ISO 8601), or null.")
    ended: str | None = doc("When it ended, or null.")
    duration_s: float | None = doc("Seconds from start to end, or null while it has not ended.")
    actor: str | None = doc("Who asked (the request's actor); null when details are withheld.")
    stop_reason: str | None = doc("Why it stopped, when it did not end on its own; or null.")
    checkpoint: str | None = doc("written, refused:<reason> or not_needed; or null.")
    checkpoint_decision: str | None = doc(
        "written, refused or not_tried (docs/operations.md#traces); null before the run ended."
    )
    checkpoint_reason: str | None = doc(
        "Why it was refused (the receipt's reason) or not tried (under_budget, "
        "stop_in_progress, too_little_time, …); or null."
    )
    error: str | None = doc("What failed, for a failed run; or null.")
    limits_hit: str | None = doc(
        "The sandbox limits its tools hit, by limit, with each tool result's seq (e.g. "
        "`file_size (bash at seq 4)`, from the record's `extra.limits_hit`); null when none."
    )
    usage: str | None = doc(
        "What its provider calls used, as pi reported them: tokens and cost, the checkpoint's "
        "summary call apart (e.g. `1,752 tokens ($0.0067), checkpoint 412 tokens`, from the "
        "record's `extra.usage`); null before it ended."
    )
    details_withheld: bool = doc(
        "The caller is not admitted to the run's answer: only status and times are shown (as the "
        "API's GET /v1/runs/{run} refuses it)."
    )


@dataclass(frozen=True, slots=True)
class TimelinePage:
    session: str = doc("The session id.")
    actor: str = doc("The caller's actor.")
    created: str = doc("When the session was created.")
    refusing: str | None = doc("Why the session refuses new prompts, or null.")
    last_seq: int = doc("The seq of the session's newest row.")
    after: int = doc("The page shows rows after this seq (?after=SEQ).")
    limit: int = doc("At most this many rows on the page (?limit=N).")
    first_shown: int | None = doc("The first seq on the page, or null when it has none.")
    last_shown: int = doc("The last seq on the page (or `after` when it has none).")
    older: int | None = doc("The `after` of the previous page, or null on the first.")
    newer: int | None = doc("The `after` of the next page, or null on the newest.")
    runs: dict[str, RunHeader] = doc("The runs of the rows shown (and the live ones), by id.")
    groups: list[dict[str, Any]] = doc(
        "The rows in seq order, grouped by run: {run, rows}. A row is {seq, run, actor, kind, "
        "bytes, media_bytes, sources, copy_of?} (copy_of: the seq of the row a follow-up view "
        "copied it from, such as the previous request) and one of message {role, parts, tool?, "
        "custom_type?, stop_reason?}, compaction {kind: continuation|pi, covers_to, summary, "
        "tokens_before, anchors: [{seq, kind, text, exit?}]} or receipt {kind, reason, run}; a "
        "withheld row is only {seq, kind: withheld}."
    )
    pending: list[RunHeader] = doc("Live or queued runs that have no row on the page yet.")
    live: list[str] = doc(
        "Runs the page follows live (running, then queued), when it shows the newest rows."
    )
    agents: list[str] = doc("The configured agents (for the next-view links).")
    fork: dict[str, Any] | None = doc(
        "What this session forks, or null: {parent, seq, run} (it begins as session `parent` "
        "up to row `seq`, the end of run `run`; run is null when that row is withheld)."
    )


@dataclass(frozen=True, slots=True)
class BudgetPart:
    part: str = doc(
        "checkpoint (its summary and anchors), previous_request, notes, suffix or free."
    )
    bytes: int = doc("Bytes of the budget this part takes (docs/contracts.md#byte-accounting).")
    percent: float = doc("Its share of the budget, in percent.")


@dataclass(frozen=True, slots=True)
class NextPage:
    session: str = doc("The session id.")
    agent: str = doc("The agent whose next run the view is for.")
    actor: str = doc("The caller's actor: the view is built with its admission.")
    agents: list[str] = doc("The configured agents.")
    status: str = doc("ok, or refused (then `refusal` says why).")
    refusal: dict[str, Any] | None = doc("The view's refusal {status, reason, detail}, or null.")
    budget: int = doc("The follow-up budget in bytes.")
    bytes: int = doc("The bytes the view takes (never above the budget).")
    parts: list[BudgetPart] = doc("The budget split by part, free space last.")
    gaps: list[dict[str, Any]] = doc("Omitted ranges {from, to, why: budget|withheld}.")
    messages: list[dict[str, Any]] = doc(
        "The messages in the order the model sees them: {part, origin, actor, copied, synthetic, "
        "bytes, message}."
    )
    checkpoint: dict[str, Any] | None = doc("{seq, bytes, run, covers_to, kind}, or null.")
    anchors: dict[str, Any] | None = doc(
        "The checkpoint's anchors {bytes, items: [{seq, kind, text, exit?}]}, or null."
    )
    previous_request: dict[str, Any] | None = doc("{seq, run, actor, mode}, or null.")
    sources: list[str] = doc("The source obligations the view carries.")


@dataclass(frozen=True, slots=True)
class SearchPage:
    session: str = doc("The session id.")
    actor: str = doc("The caller's actor: the search admits rows as it may read them.")
    query: str = doc("The words searched for (?q=); empty before a search.")
    hits: list[dict[str, Any]] = doc(
        "Rows the actor may read that match, best first: {seq, actor, role, snippet} (the "
        "answer of `tether recall -s S --actor A QUERY --json`)."
    )
    withheld: list[dict[str, int]] = doc(
        "Matching rows the actor may not read, named as ranges {from, to}, never shown."
    )
    withheld_more: bool = doc("More withheld ranges matched than are named.")
    at_most: int = doc("Hits shown at most (recall's bound).")
    error: str | None = doc("Why the query could not be searched (it has no words), or null.")


@dataclass(frozen=True, slots=True)
class ErrorPage:
    status: int = doc("The HTTP status of the answer.")
    title: str = doc("The status's name (Not Found, Forbidden, …).")
    detail: str = doc("What went wrong, in the service's words (never a path of the server).")
    what_to_do: str = doc("What the reader can do about it.")
