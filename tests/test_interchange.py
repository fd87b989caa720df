"""The ledger JSONL interchange format: load → dump round trips, and bad files write nothing."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.tier import examples
from tether.errors import InterchangeError
from tether.ledger import Ledger, open_ledger
from tether.ledger.jsonl import dump_session, load_file, load_lines

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def dump(ledger: Ledger, session: str) -> str:
    out = io.StringIO()
    dump_session(ledger, session, out)
    return out.getvalue()


def test_example_round_trips(ledger: Ledger) -> None:
    report = load_file(ledger, EXAMPLE)
    assert (report.sessions, report.runs, report.rows, report.notes) == (1, 2, 11, 1)
    original = records(EXAMPLE.read_text())
    assert records(dump(ledger, "review-42")) == original


def test_unknown_fields_survive_a_round_trip(ledger: Ledger) -> None:
    lines = [
        {"type": "session", "id": "s", "created": "t", "team": {"name": "api"}},
        {
            "type": "run",
            "id": "r",
            "session": "s",
            "agent": "a",
            "status": "finished",
            "request_seq": 1,
            "started": None,
            "ended": None,
            "cost_usd": 0.5,
        },
        {
            "type": "row",
            "session": "s",
            "seq": 1,
            "run": "r",
            "actor": "user:x",
            "sources": [],
            "message": {"role": "user", "content": "hi", "vendorField": [1, 2]},
            "labels": ["a"],
        },
        {
            "type": "row",
            "session": "s",
            "seq": 2,
            "run": "r",
            "actor": "agent:a",
            "sources": [],
            "receipt": {"kind": "continuation_checkpoint_refused", "run": "r", "reason": "empty"},
        },
        {"type": "note", "session": "s", "agent": "a", "text": "n", "at": "t", "pinned": True},
    ]
    data = "\n".join(json.dumps(x) for x in lines).encode()
    load_lines(ledger, data, "mem")
    assert records(dump(ledger, "s")) == lines


def _blocks(*, assistant: bool = False) -> st.SearchStrategy[list[dict[str, Any]]]:
    # pi's block types by role: text and images from users and tools, text and thinking
    # (and tool calls) from the assistant
    text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
    block = st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.builds(lambda t: {"type": "thinking", "thinking": t}, text)
        if assistant
        else st.builds(
            lambda d: {"type": "image", "data": d, "mimeType": "image/png"},
            st.text("ABCDEFGH0123+/", max_size=64),
        ),
    )
    return st.lists(block, min_size=1, max_size=3)


USAGE = {
    "input": 10,
    "output": 2,
    "cacheRead": 0,
    "cacheWrite": 0,
    "totalTokens": 12,
    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
}


_example = itertools.count()


@st.composite
def sessions(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = next(_example)  # fresh ids per example: one ledger serves them all
    sid = f"s{n}"
    out: list[dict[str, Any]] = [{"type": "session", "id": sid, "created": "2026-11-29T10:00:00Z"}]
    n_runs = draw(st.integers(0, 3))
    runs = [f"r{n}-{i}" for i in range(n_runs)]
    rows: list[dict[str, Any]] = []
    request_of: dict[str, int] = {}
    for seq in range(1, draw(st.integers(0, 25)) + 1):
        run = draw(st.sampled_from([*runs, None]))
        kind = draw(st.sampled_from(["user", "assistant", "tool", "compaction", "receipt"]))
        base: dict[str, Any] = {
            "type": "row",
            "session": sid,
            "seq": seq,
            "run": run,
            "actor": draw(st.sampled_from(["user:ana", "agent:rev", "tool:bash"])),
            "sources": draw(
                st.lists(st.sampled_from(["repo:a/b", "doc:hb"]), max_size=2, unique=True)
            ),
        }
        if kind == "user":
            base["message"] = {"role": "user", "content": draw(_blocks()), "timestamp": seq}
            if run is not None:
                request_of.setdefault(run, seq)
        elif kind == "assistant":
            content = draw(_blocks(assistant=True))
            content.append(
                {
                    "type": "toolCall",
                    "id": f"c{seq}",
                    "name": "bash",
                    "arguments": {"command": "ls"},
                }
            )
            base["message"] = {
                "role": "assistant",
                "content": content,
                "stopReason": "toolUse",
                "usage": USAGE,
            }
        elif kind == "tool":
            base["message"] = {
                "role": "toolResult",
                "toolCallId": f"c{seq - 1}",
                "toolName": "bash",
                "content": draw(_blocks()),
                "isError": draw(st.booleans()),
            }
        elif kind == "compaction":
            base["compaction"] = {
                "summary": draw(st.text(max_size=80)),
                "covers_to": seq - 1,
                "tokens_before": draw(st.integers(0, 10**6)),
            }
        else:
            base["receipt"] = {
                "kind": "continuation_checkpoint_refused",
                "run": run or "r?",
                "reason": draw(st.sampled_from(["cancelled", "empty", "truncated"])),
            }
        rows.append(base)
    for run in runs:
        out.append(
            {
                "type": "run",
                "id": run,
                "session": sid,
                "agent": "rev",
                "status": draw(
                    st.sampled_from(["queued", "running", "finished", "failed", "interrupted"])
                ),
                "request_seq": request_of.get(run),
                "started": "2026-11-29T10:00:01Z",
                "ended": None,
            }
        )
    out.extend(rows)
    for i in range(draw(st.integers(0, 3))):
        out.append({"type": "note", "session": sid, "agent": "rev", "text": f"note {i}", "at": "t"})
    return out


@settings(
    max_examples=examples(60, unit=12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sessions())
def test_generated_sessions_round_trip(ledger: Ledger, recs: list[dict[str, Any]]) -> None:
    sid = recs[0]["id"]
    data = "\n".join(json.dumps(r, ensure_ascii=False) for r in recs).encode()
    load_lines(ledger, data, "gen")
    dumped = records(dump(ledger, sid))
    assert dumped == recs
    # a second round trip through a new ledger is a fixed point
    with open_ledger("memory:") as again:
        load_lines(again, dump(ledger, sid).encode(), "again")
        assert records(dump(again, sid)) == dumped


GOOD = EXAMPLE.read_bytes().split(b"\n")


def _with_line(index: int, line: bytes) -> bytes:
    lines = list(GOOD)
    lines[index] = line
    return b"\n".join(lines)


BAD_FILES = {
    "malformed JSON": (_with_line(3, b'{"type":"row",'), 4, "malformed JSON"),
    "unknown record type": (_with_line(3, b'{"type":"blob"}'), 4, "unknown record type 'blob'"),
    "duplicate seq": (
        _with_line(4, GOOD[3]),
        5,
        "duplicate seq 1",
    ),
    "non-dense seq": (
        _with_line(3, GOOD[3].replace(b'"seq": 1,', b'"seq": 3,')),
        4,
        "not dense (expected 1)",
    ),
    "unknown session": (
        _with_line(3, GOOD[3].replace(b'"session": "review-42"', b'"session": "ghost"')),
        4,
        "unknown session 'ghost'",
    ),
    "unknown run": (
        _with_line(3, GOOD[3].replace(b'"run": "r1"', b'"run": "r9"')),
        4,
        "unknown run 'r9'",
    ),
    "invalid UTF-8": (_with_line(5, GOOD[5][:40] + b"\xff\xfe" + GOOD[5][40:]), 6, "invalid UTF-8"),
    "tool result without toolCallId": (
        _with_line(5, GOOD[5].replace(b'"toolCallId": "call_1", ', b"")),
        6,
        "toolResult message has no 'toolCallId'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_names_line_and_problem_and_writes_nothing(
    ledger: Ledger, tmp_path: Path, case: str
) -> None:
    data, line, problem = BAD_FILES[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    with pytest.raises(InterchangeError) as info:
        load_file(ledger, path)
    assert info.value.line == line
    assert problem in info.value.problem
    assert str(path) in str(info.value)
    assert ledger.sessions() == []


def test_loading_twice_is_refused_and_writes_nothing(ledger: Ledger) -> None:
    load_file(ledger, EXAMPLE)
    before = dump(ledger, "review-42")
    with pytest.raises(InterchangeError, match="already exists"):
        load_file(ledger, EXAMPLE)
    assert dump(ledger, "review-42") == before


def test_rows_may_continue_a_session_in_the_ledger(ledger: Ledger) -> None:
    load_file(ledger, EXAMPLE)
    more = {
        "type": "row",
        "session": "review-42",
        "seq": 12,
        "run": "r2",
        "actor": "user:ana",
        "sources": [],
        "message": {"role": "user", "content": "thanks"},
    }
    load_lines(ledger, json.dumps(more).encode(), "more")
    assert ledger.last_seq("review-42") == 12
    with pytest.raises(InterchangeError, match="not dense"):
        load_lines(ledger, json.dumps({**more, "seq": 14}).encode(), "gap")
