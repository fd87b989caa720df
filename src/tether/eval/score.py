"""Scoring planted facts against a follow-up view (docs/cli.md#tether-eval-continuation),
deterministically.

- **available**: the fact's needle occurs verbatim in the view, by part: ``summary`` (the quoted
  checkpoint), ``anchors`` (its quoted anchors), ``request`` (the previous request), ``suffix``
  (the other rows the view carries), ``notes``. Notices tether writes itself do not count.
- **recoverable**: not available, but one recall call that the view itself names returns it: a
  gap notice's range, the checkpoint's covered range, or an anchor's row. Each call is made as the
  next run's actor (admission applies: withheld rows are named, never shown) and its answer is the
  one the recall tool would give (cut at 16,000 bytes). A query on the needle does not count: the
  next run would not know it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.eval.workspace import Fact
from tether.followup import FollowupView, ViewMessage
from tether.followup.messages import ANCHORS_TYPE, CHECKPOINT_TYPE, NOTES_TYPE

__all__ = ["FactScore", "Part", "ViewScore", "named_calls", "part_of", "score_view"]


class Part(enum.StrEnum):
    SUMMARY = "summary"
    ANCHORS = "anchors"
    REQUEST = "request"
    SUFFIX = "suffix"
    NOTES = "notes"
    NOTICES = "notices"
    """Gap notices and other messages tether writes itself: never counted as knowing a fact."""


_BY_TYPE = {CHECKPOINT_TYPE: Part.SUMMARY, ANCHORS_TYPE: Part.ANCHORS, NOTES_TYPE: Part.NOTES}


def part_of(message: ViewMessage, request_seq: int | None) -> Part:
    if message.synthetic:
        return _BY_TYPE.get(str(message.message.get("customType")), Part.NOTICES)
    if request_seq is not None and message.origin == request_seq:
        return Part.REQUEST
    return Part.SUFFIX


def text_of(message: dict[str, Any]) -> str:
    """Everything of a message the model reads: text blocks, tool call arguments, commands."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") == "toolCall":
                parts.append(json.dumps(block.get("arguments"), ensure_ascii=False))
    for key in ("command", "output", "summary"):
        if isinstance(message.get(key), str):
            parts.append(message[key])
    return "\n".join(parts)


def _contains(text: str, needle: str) -> bool:
    # A needle quoted inside JSON (a tool call's arguments, an anchor) counts as verbatim too.
    return needle in text or json.dumps(needle, ensure_ascii=False)[1:-1] in text


@dataclass(frozen=True)
class FactScore:
    fact: Fact
    parts: tuple[Part, ...]
    """The parts of the view holding the needle (empty: not available)."""
    recovered_by: tuple[int, int] | None
    """The named recall range that returns it, when it is not available."""

    @property
    def available(self) -> bool:
        return bool(self.parts)

    @property
    def recoverable(self) -> bool:
        return self.recovered_by is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "fact": self.fact.id,
            "kind": self.fact.kind.value,
            "available": self.available,
            "parts": [p.value for p in self.parts],
            "recoverable": self.recoverable,
            "recall": (
                {"from": self.recovered_by[0], "to": self.recovered_by[1]}
                if self.recovered_by
                else None
            ),
        }


@dataclass
class ViewScore:
    facts: list[FactScore]
    bytes_by_part: dict[str, int]
    view_bytes: int
    budget: int
    summary_needles: list[str] = field(default_factory=list)
    """Needles the quoted summary itself carries."""


def named_calls(view: FollowupView) -> list[tuple[int, int]]:
    """Every recall range the view names, in view order: gap notices, the checkpoint's covered
    range, and each anchor's row."""
    calls: list[tuple[int, int]] = [(g.first, g.last) for g in view.gaps]
    cp = view.checkpoint
    if cp is not None:
        if cp.covers_to > 0:
            calls.append((1, cp.covers_to))
        calls += [(int(a["seq"]), int(a["seq"])) for a in cp.anchors]
    return list(dict.fromkeys(calls))


def score_view(
    view: FollowupView, facts: Iterable[Fact], recall: Callable[[int, int], str]
) -> ViewScore:
    """Score ``facts`` against ``view``; ``recall(first, last)`` is the text the recall tool
    would answer the next run's actor for that range."""
    request_seq = view.previous_request.seq if view.previous_request else None
    texts: dict[Part, list[str]] = {}
    sizes: dict[str, int] = {}
    for m in view.messages:
        part = part_of(m, request_seq)
        texts.setdefault(part, []).append(text_of(m.message))
        sizes[part.value] = sizes.get(part.value, 0) + m.bytes
    joined = {part: "\n".join(t) for part, t in texts.items() if part is not Part.NOTICES}
    calls = named_calls(view)
    answers: dict[tuple[int, int], str] = {}
    scores: list[FactScore] = []
    for fact in facts:
        parts = tuple(p for p, t in joined.items() if _contains(t, fact.needle))
        found: tuple[int, int] | None = None
        if not parts:
            for call in calls:
                if call not in answers:
                    answers[call] = recall(*call)
                if _contains(answers[call], fact.needle):
                    found = call
                    break
        scores.append(FactScore(fact, parts, found))
    return ViewScore(
        facts=scores,
        bytes_by_part=sizes,
        view_bytes=view.bytes,
        budget=view.budget,
        summary_needles=[s.fact.needle for s in scores if Part.SUMMARY in s.parts],
    )


def share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None
