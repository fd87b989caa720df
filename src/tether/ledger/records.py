"""The interchange records (docs/contracts.md#the-interchange-format) as a schema: a discriminated
union on ``type``.

What loads is what pi can take: a pi AgentMessage is checked against pi's own message types
(``pi-ai``'s ``Message`` and ``pi-coding-agent``'s ``bashExecution``, ``custom``,
``branchSummary`` and ``compactionSummary``) as far as
pi reads them: the role, the content's type, each block's fields, finite numbers, a timestamp
that is a date. Fields the schema does not name are kept (``extra="allow"``), so a round trip
loses nothing. Types are strict: ``"1"`` is not a seq and ``true`` is not a number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails

from tether.ids import id_problem
from tether.ledger.models import ReceiptReason, RunStatus

__all__ = [
    "MAX_TIMESTAMP_MS",
    "AgentMessage",
    "NoteRecord",
    "Record",
    "RowRecord",
    "RunRecord",
    "SessionRecord",
    "describe_error",
    "fill_pi_defaults",
    "validate_record",
]

# pi's timestamps are JavaScript milliseconds since the epoch. A JavaScript Date ends at 8.64e15
# and a Python datetime at the end of year 9999: a timestamp beyond that is not a date either can
# print (pi's `new Date(ts).toISOString()` throws, and so would tether writing pi's session file).
MAX_TIMESTAMP_MS = 253_402_300_799_999


def _id(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"an id {problem}")
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


def _timestamp(value: float) -> float:
    if not 0 <= value <= MAX_TIMESTAMP_MS:
        raise ValueError(
            f"a timestamp is milliseconds since 1970 up to the year 9999 (0 to {MAX_TIMESTAMP_MS})"
        )
    return value


Id = Annotated[str, AfterValidator(_id)]
Text = Annotated[str, AfterValidator(_non_empty)]
Number = StrictInt | StrictFloat
Timestamp = Annotated[StrictInt | StrictFloat, AfterValidator(_timestamp)]


class _Open(BaseModel):
    """Strict types; unknown fields kept."""

    model_config = ConfigDict(extra="allow", strict=True)


# -- pi's content blocks and messages --------------------------------------------------------


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str


class ImageBlock(_Open):
    type: Literal["image"]
    data: str
    mimeType: str


class ToolCallBlock(_Open):
    type: Literal["toolCall"]
    id: Text
    name: Text
    arguments: dict[str, Any]


UserBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]
AssistantBlock = Annotated[TextBlock | ThinkingBlock | ToolCallBlock, Field(discriminator="type")]


class _Message(_Open):
    timestamp: Timestamp | None = None


class SystemMessage(_Message):
    role: Literal["system"]
    content: str | list[TextBlock]


class UserMessage(_Message):
    role: Literal["user"]
    content: str | list[UserBlock]


class Cost(_Open):
    input: Number = 0
    output: Number = 0
    cacheRead: Number = 0
    cacheWrite: Number = 0
    total: Number = 0


class Usage(_Open):
    input: Number = 0
    output: Number = 0
    cacheRead: Number = 0
    cacheWrite: Number = 0
    totalTokens: Number = 0
    cost: Cost = Cost()


StopReason = Literal["pending", "stop", "length", "toolUse", "error", "aborted", "deferred"]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: list[AssistantBlock]
    usage: Usage | None = None
    stopReason: StopReason | None = None


class ToolResultMessage(_Message):
    role: Literal["toolResult"]
    toolCallId: Text
    toolName: str | None = None
    content: list[UserBlock]
    isError: bool | None = None


class BashExecutionMessage(_Message):
    role: Literal["bashExecution"]
    command: str
    output: str
    exitCode: StrictInt | None = None
    cancelled: bool | None = None
    truncated: bool | None = None


class CustomMessage(_Message):
    role: Literal["custom"]
    customType: str | None = None
    content: str | list[UserBlock]
    display: bool | None = None


class BranchSummaryMessage(_Message):
    """pi's summary of an abandoned branch (the mirror writes these from ``branch_summary``)."""

    role: Literal["branchSummary"]
    summary: str
    fromId: str | None = None


class CompactionSummaryMessage(_Message):
    role: Literal["compactionSummary"]
    summary: str
    tokensBefore: Number | None = None


AgentMessage = Annotated[
    SystemMessage
    | UserMessage
    | AssistantMessage
    | ToolResultMessage
    | BashExecutionMessage
    | CustomMessage
    | BranchSummaryMessage
    | CompactionSummaryMessage,
    Field(discriminator="role"),
]

_USAGE_DEFAULT: dict[str, Any] = Usage().model_dump()


def fill_pi_defaults(message: dict[str, Any]) -> dict[str, Any]:
    """What pi fills whenever it writes a message, filled in place on load: an assistant's
    ``usage`` (zeros; pi's compaction reads ``usage.totalTokens`` of every assistant message)
    and ``stopReason`` (``stop``)."""
    if message.get("role") != "assistant":
        return message
    usage = message.get("usage")
    if usage is None:
        message["usage"] = {**_USAGE_DEFAULT, "cost": dict(_USAGE_DEFAULT["cost"])}
    else:
        for key, value in _USAGE_DEFAULT.items():
            if key not in usage:
                usage[key] = dict(value) if isinstance(value, dict) else value
        for key, value in _USAGE_DEFAULT["cost"].items():
            usage["cost"].setdefault(key, value)
    if message.get("stopReason") is None:
        message["stopReason"] = "stop"
    return message


# -- ledger records ----------------------------------------------------------------------------


class Compaction(_Open):
    summary: str
    covers_to: StrictInt | None = None
    tokens_before: Number | None = None


class Receipt(_Open):
    kind: Text
    reason: Literal[tuple(r.value for r in ReceiptReason)] | None = None  # type: ignore[valid-type]


class SessionRecord(_Open):
    type: Literal["session"]
    id: Id
    created: Text
    refusing: str | None = None


class RunRecord(_Open):
    type: Literal["run"]
    id: Id
    session: Id
    agent: Id
    status: Literal[tuple(s.value for s in RunStatus)]  # type: ignore[valid-type]
    request_seq: Annotated[StrictInt, Field(ge=1)] | None = None
    started: Text | None = None
    ended: Text | None = None
    epoch: Annotated[StrictInt, Field(ge=0)] = 0


class RowRecord(_Open):
    type: Literal["row"]
    session: Id
    seq: Annotated[StrictInt, Field(ge=1, le=2**62)]
    run: Id | None = None
    actor: Id
    sources: list[Text] = []
    entry: Text | None = None
    message: AgentMessage | None = None
    compaction: Compaction | None = None
    receipt: Receipt | None = None


class NoteRecord(_Open):
    type: Literal["note"]
    session: Id
    agent: Id
    text: str
    at: Text
    actor: Id | None = None
    run: Id | None = None
    sources: list[Text] = []


Record = Annotated[SessionRecord | RunRecord | RowRecord | NoteRecord, Field(discriminator="type")]
_RECORD: TypeAdapter[SessionRecord | RunRecord | RowRecord | NoteRecord] = TypeAdapter(Record)

_TAGS = {"session", "run", "row", "note"} | {
    "system",
    "user",
    "assistant",
    "toolResult",
    "bashExecution",
    "custom",
    "branchSummary",
    "compactionSummary",
    "text",
    "thinking",
    "image",
    "toolCall",
}


def validate_record(obj: dict[str, Any]) -> SessionRecord | RunRecord | RowRecord | NoteRecord:
    """The record, or :class:`pydantic.ValidationError` (see :func:`describe_error`)."""
    return _RECORD.validate_python(obj)


def _where(loc: tuple[int | str, ...]) -> str:
    """A field's path as the file spells it: ``message.content[0].text``. The union tags and
    member names that pydantic puts in the path are dropped: the record names them itself."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        previous = loc[i - 1] if i else None
        if part in _TAGS and (i == 0 or previous == "message" or isinstance(previous, int)):
            continue
        if part == "str" or "[" in part or part.endswith(("Block", "Message")):
            continue
        out += f".{part}" if out else part
    return out


def _one(err: ErrorDetails) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    where = _where(loc)
    ctx = err.get("ctx") or {}
    if kind == "union_tag_invalid":
        tag = ctx.get("tag")
        field = ctx.get("discriminator", "'type'").strip("'")
        if not loc:
            return f"unknown record type {tag!r} (expected session, run, row or note)"
        what = "role" if field == "role" else f"{where or 'block'} type"
        return f"unknown {what} {tag!r} (expected {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        field = str(ctx.get("discriminator", "'type'")).strip("'")
        return f"{where or 'the record'} has no {field!r}"
    if kind == "missing":
        owner = _where(loc[:-1])
        role = next((p for p in loc if p in _TAGS and p not in ("row",)), None)
        if role and loc[:2] == ("row", "message") and len(loc) == 4:
            return f"a {role} message has no {loc[-1]!r}"
        return f"{owner or 'the record'} has no {loc[-1]!r}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def describe_error(exc: ValidationError) -> str:
    """One line for the first problem of a record (and how many more there are)."""
    errors = exc.errors(include_url=False, include_input=False)
    # `str | list[…]` fields report one error per member; the list's is the useful one
    # when the value is a list, the str's otherwise: show the most specific (longest path).
    first = max(errors, key=lambda e: len(e["loc"])) if errors else None
    if first is None:
        return "invalid record"
    line = _one(first)
    where = _where(tuple(first["loc"]))
    kinds = [
        e["type"].removesuffix("_type")
        for e in errors
        if _where(tuple(e["loc"])) == where and e["type"].endswith("_type")
    ]
    if len(kinds) > 1 and first["type"].endswith("_type"):
        # `str | list[…]` reports one error per member: one line says both
        line = f"{where}: should be a {' or a '.join(kinds)}".replace("a int", "an int")
        errors = [e for e in errors if _where(tuple(e["loc"])) != where]
        errors.append(first)
    more = len(errors) - 1
    return line if more == 0 else f"{line} (and {more} more problem{'s' * (more > 1)})"
