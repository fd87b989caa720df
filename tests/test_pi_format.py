"""pi's session format, one mapping (tether.pi.sessionformat): a pi entry becomes the same row
whether the mirror reads it from a run's file or ``tether import pi`` reads it from a file, and
an export writes the entry pi builds that message from. The real pi's files are in
tests/test_interop.py (``test_imported_and_mirrored_entries_are_the_same_rows``)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.tier import examples
from tether.interop import import_pi
from tether.ledger import Ledger, RowKind, open_ledger
from tether.mirror.entries import Actors
from tether.mirror.mirror import Mirror
from tether.pi.sessionformat import entry_message, message_entry

AGENT = "rev"
USER = "user:ana"
HEADER = {
    "type": "session",
    "version": 3,
    "id": "0e6c1c5e-5b8e-4a59-9d0a-7f3f3a0c1d11",
    "timestamp": "2026-11-29T10:00:00.000Z",
    "cwd": "/work",
}

Shape = tuple[RowKind, str, dict[str, Any], str | None]


def rows_of(store: Ledger, session: str) -> list[Shape]:
    return [(r.kind, r.actor, r.body, r.entry_id) for r in store.iter_rows(session)]


_sessions = itertools.count()


@contextlib.contextmanager
def _in(store: Ledger | None) -> Iterator[tuple[Ledger, str]]:
    """``store`` (a new session in it), or a new in-memory ledger."""
    session = f"s{next(_sessions)}"
    if store is not None:
        yield store, session
        return
    with open_ledger("memory:") as new:
        yield new, session


def imported(path: Path, store: Ledger | None = None) -> list[Shape]:
    with _in(store) as (ledger, session):
        import_pi(ledger, path, session=session, agent=AGENT, actor=USER)
        return rows_of(ledger, session)


def mirrored(path: Path, store: Ledger | None = None) -> list[Shape]:
    """The file as the mirror writes it during a run: every entry, read from the start."""
    with _in(store) as (ledger, session):
        ledger.ensure_session(session)
        fence = ledger.claim_run(ledger.create_run(session, AGENT).id)
        mirror = Mirror(ledger, fence, session_file=path, actors=Actors(user=USER, agent=AGENT))

        async def sync() -> None:
            await mirror.sync(final=True)

        anyio.run(sync)
        return rows_of(ledger, session)


def write(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in [HEADER, *entries]))
    return path


# -- generated entries ----------------------------------------------------------------------

_ABSENT = object()

stamps = st.sampled_from(
    [
        "2026-11-29T10:00:00.000Z",
        "2026-11-29T10:00:01.123Z",
        "2026-11-29T12:00:00.999+02:00",
        "2026-11-29T10:00:02.007",  # no offset
        "not a date",
        _ABSENT,
    ]
)
texts = st.text(alphabet="abc xyz\u2028é", min_size=0, max_size=8)
text_blocks = st.lists(st.builds(lambda t: {"type": "text", "text": t}, texts), max_size=2)
user_content = st.one_of(texts, text_blocks, st.none(), st.just(_ABSENT))
block_content = st.one_of(text_blocks, st.none(), st.just(_ABSENT))


def _put(out: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is not _ABSENT:
        out[key] = value
    return out


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(
        st.sampled_from(
            ["user", "assistant", "toolResult", "system", "bashExecution", "custom", "hookMessage"]
        )
    )
    out: dict[str, Any] = {"role": role, "timestamp": draw(st.integers(0, 2**41))}
    if role == "user":
        _put(out, "content", draw(user_content))
    elif role == "assistant":
        _put(out, "content", draw(block_content))
        out["stopReason"] = draw(st.sampled_from(["stop", "toolUse", "length", "error"]))
    elif role == "toolResult":
        _put(out, "content", draw(block_content))
        out["toolCallId"] = "call_1"
        _put(out, "toolName", draw(st.sampled_from(["bash", "read", _ABSENT])))
        out["isError"] = draw(st.booleans())
    elif role == "system":
        _put(out, "content", draw(st.one_of(texts, st.none(), st.just(_ABSENT))))
    elif role == "bashExecution":
        out.update(command="ls", output=draw(texts), exitCode=0, cancelled=False, truncated=False)
    else:  # custom, or v2's hookMessage
        out["customType"] = "ext"
        _put(out, "content", draw(user_content))
        _put(out, "display", draw(st.sampled_from([True, False, _ABSENT])))
    return out


@st.composite
def entry_bodies(draw: st.DrawFn, earlier: list[str]) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            ["message"] * 4
            + ["custom_message", "branch_summary", "compaction", "receipt", "bookkeeping"]
        )
    )
    if kind == "message":
        return {"type": "message", "message": draw(messages())}
    if kind == "custom_message":
        out: dict[str, Any] = {"type": "custom_message", "customType": "ext.note"}
        _put(out, "content", draw(user_content))
        _put(out, "display", draw(st.sampled_from([True, False, _ABSENT])))
        _put(out, "details", draw(st.sampled_from([{"k": 1}, None, _ABSENT])))
        return out
    if kind == "branch_summary":
        out = {"type": "branch_summary"}
        _put(out, "summary", draw(st.sampled_from(["tried a thing", "", _ABSENT])))
        _put(out, "fromId", draw(st.sampled_from(["abc12345", None, _ABSENT])))
        return out
    if kind == "compaction":
        out = {
            "type": "compaction",
            "summary": draw(texts),
            "tokensBefore": draw(st.integers(0, 9)),
        }
        # an earlier entry, none (keeps nothing), or its own id (filled in by the caller)
        _put(out, "firstKeptEntryId", draw(st.sampled_from([*earlier, "SELF", _ABSENT])))
        marker = {"continuation": {"version": 1, "run": "r-1"}}
        _put(out, "details", draw(st.sampled_from([marker, {"readFiles": []}, _ABSENT])))
        _put(out, "fromHook", draw(st.sampled_from([True, False, _ABSENT])))
        return out
    if kind == "receipt":
        data = {"kind": "continuation_checkpoint_refused", "run": "r-1", "reason": "empty"}
        return {"type": "custom", "customType": "tether.receipt", "data": data}
    return draw(
        st.sampled_from(
            [
                {"type": "model_change", "provider": "local", "modelId": "m"},
                {"type": "thinking_level_change", "thinkingLevel": "high"},
                {"type": "label", "targetId": "00000000", "label": "here"},
                {"type": "session_info", "name": "a name"},
                {"type": "custom", "customType": "ext.state", "data": {"count": 1}},
            ]
        )
    )


@st.composite
def session_files(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A linear pi session (one branch, no context edits: what a run's file holds)."""
    entries: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 12))):
        eid = f"{i:08x}"
        body = draw(entry_bodies([e["id"] for e in entries]))
        if body.get("firstKeptEntryId") == "SELF":
            body["firstKeptEntryId"] = eid
        head = {"id": eid, "parentId": entries[-1]["id"] if entries else None}
        entries.append(_put({**body, **head}, "timestamp", draw(stamps)))
    return entries


@pytest.fixture(scope="module")
def store() -> Iterator[Ledger]:
    """One ledger for every generated file (a session each): opening one costs more than a file."""
    with open_ledger("memory:") as ledger:
        yield ledger


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("generated")


@settings(
    max_examples=examples(150, unit=30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(entries=session_files())
def test_generated_entries_imported_and_mirrored_are_the_same_rows(
    entries: list[dict[str, Any]], store: Ledger, scratch: Path
) -> None:
    path = write(scratch / "session.jsonl", entries)  # each example rewrites it
    assert imported(path, store) == mirrored(path, store)


@settings(max_examples=examples(150, unit=30), deadline=None)
@given(message=messages(), stamp=stamps)
def test_an_exported_message_is_the_message_pi_builds_from_its_entry(
    message: dict[str, Any], stamp: Any
) -> None:
    message = entry_message({"type": "message", "message": message}) or {}
    stamp = "2026-11-29T10:00:00.000Z" if stamp is _ABSENT else stamp
    entry = {"id": "e1", "parentId": None, "timestamp": stamp, **message_entry(message, stamp)}
    assert entry_message(entry) == message


# -- the decisions, one by one (pi's sessionEntryToContextMessages) --------------------------


def test_fields_an_entry_does_not_have_stay_absent_and_null_content_is_read_as_pi_reads_it(
    tmp_path: Path,
) -> None:
    stamp = "2026-11-29T10:00:01.123Z"
    entries = [
        {"type": "custom_message", "customType": "x", "content": None},
        {"type": "branch_summary", "summary": "went elsewhere"},
        {"type": "branch_summary", "summary": ""},
        {"type": "message", "message": {"role": "assistant", "content": None}},
        {"type": "message", "message": {"role": "system"}},
        {"type": "message", "message": {"role": "hookMessage", "customType": "h", "content": "c"}},
    ]
    for i, e in enumerate(entries):
        e.update(id=f"e{i}", parentId=f"e{i - 1}" if i else None, timestamp=stamp)
    path = write(tmp_path / "s.jsonl", entries)
    rows = imported(path)
    assert rows == mirrored(path)
    assert [body for _, _, body, _ in rows] == [
        # no display: false, no fromId: null that the entry does not have (pi's JSON has none)
        {"role": "custom", "customType": "x", "content": [], "timestamp": 1795946401123},
        {"role": "branchSummary", "summary": "went elsewhere", "timestamp": 1795946401123},
        # the empty branch summary: pi's context has no message for it, so no row
        {"role": "assistant", "content": []},
        {"role": "system", "content": ""},
        {"role": "custom", "customType": "h", "content": "c"},
    ]
    assert {actor for _, actor, _, _ in rows} == {f"agent:{AGENT}"}
