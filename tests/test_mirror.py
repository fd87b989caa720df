"""The mirror on pi session files written by hand, on every ledger backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tether.errors import StorageError
from tether.events import EventBus, RowsMirrored, RunEvent
from tether.ledger import Fence, Ledger, NewRow, RowKind
from tether.mirror.entries import Actors
from tether.mirror.mirror import Mirror

ACTORS = Actors(user="user:ana", agent="rev")


def _entry(eid: str, kind: str = "message", **fields: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "id": eid,
        "parentId": None,
        "timestamp": "2026-11-29T10:00:00.000Z",
        **fields,
    }


def user(eid: str, text: str) -> dict[str, Any]:
    return _entry(eid, message={"role": "user", "content": [{"type": "text", "text": text}]})


def assistant(eid: str, text: str, stop: str = "stop", **more: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += more.pop("calls", [])
    return _entry(
        eid, message={"role": "assistant", "content": content, "stopReason": stop, **more}
    )


def result(eid: str, call: str, tool: str, text: str) -> dict[str, Any]:
    return _entry(
        eid,
        message={
            "role": "toolResult",
            "toolCallId": call,
            "toolName": tool,
            "content": [{"type": "text", "text": text}],
            "isError": False,
        },
    )


def write(path: Path, *entries: dict[str, Any], partial: str = "") -> None:
    with path.open("a") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")
        f.write(partial)


def start(ledger: Ledger, request: str = "do it") -> tuple[Fence, int]:
    ledger.ensure_session("s1")
    run = ledger.create_run("s1", "rev")
    fence = ledger.claim_run(run.id)
    row = NewRow.message(
        "user:ana", {"role": "user", "content": [{"type": "text", "text": request}]}
    )
    seq = ledger.append(fence, [row], request=True)[0].seq
    return fence, seq


def mirror_for(ledger: Ledger, fence: Fence, path: Path, req_seq: int, **kw: Any) -> Mirror:
    return Mirror(ledger, fence, session_file=path, actors=ACTORS, request=("do it", req_seq), **kw)


def started_mirror(ledger: Ledger, tmp_path: Path) -> tuple[Path, Fence, Mirror]:
    """A run started on s1 and its mirror of pi's session file ``tmp_path/s.jsonl``."""
    path = tmp_path / "s.jsonl"
    fence, req = start(ledger)
    return path, fence, mirror_for(ledger, fence, path, req)


def test_entries_become_rows_with_actors_and_a_restart_duplicates_nothing(
    ledger: Ledger, tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"
    fence, req = start(ledger)
    call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}}
    write(
        path,
        {"type": "session", "version": 3, "id": "x", "timestamp": "t", "cwd": "/"},
        _entry("m1", "model_change", provider="p", modelId="m"),
        _entry("sy", message={"role": "system", "content": "", "sections": {"a": "b"}}),
        user("u1", "do it"),
        assistant("a1", "looking", calls=[call]),
        result("t1", "c1", "bash", "files"),
        _entry("cm", "custom_message", customType="ext", content="injected", display=False),
        assistant("a2", "done"),
    )
    seen: list[RunEvent] = []
    first = mirror_for(ledger, fence, path, req, bus=EventBus([seen.append]))
    anyio.run(first.sync)
    rows = list(ledger.iter_rows("s1"))
    assert [(r.seq, r.actor, r.role, r.entry_id) for r in rows] == [
        (1, "user:ana", "user", None),
        (2, "agent:rev", "system", "sy"),
        (3, "agent:rev", "assistant", "a1"),
        (4, "tool:bash", "toolResult", "t1"),
        (5, "agent:rev", "custom", "cm"),
        (6, "agent:rev", "assistant", "a2"),
    ]
    assert rows[4].body["content"] == "injected"
    assert first.skipped["model_change"] == 1
    mirrored = [e for e in seen if isinstance(e, RowsMirrored)]
    assert [s for e in mirrored for s in e.seqs] == [2, 3, 4, 5, 6]

    again = mirror_for(ledger, fence, path, req)  # a restart reads the whole file again
    anyio.run(again.sync)
    assert [r.seq for r in ledger.iter_rows("s1")] == [1, 2, 3, 4, 5, 6]
    assert again.seq_of("a2") == 6


def test_partial_lines_wait_and_prewritten_entries_are_skipped(
    ledger: Ledger, tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"
    fence, req = start(ledger)
    write(path, user("old", "earlier request"), assistant("olda", "earlier answer"))
    offset = path.stat().st_size
    half = json.dumps(assistant("a1", "whole at last"))
    write(path, user("u1", "do it"), partial=half[:20])
    m = mirror_for(ledger, fence, path, req, start_offset=offset, known={"old": 1, "olda": None})
    anyio.run(m.sync)
    assert [r.seq for r in ledger.iter_rows("s1")] == [1], "the request entry is the request row"
    with path.open("a") as f:
        f.write(half[20:] + "\n")
    anyio.run(m.sync)
    rows = list(ledger.iter_rows("s1"))
    assert [r.entry_id for r in rows] == [None, "a1"]
    assert rows[1].body["content"][0]["text"] == "whole at last"


def test_failed_attempt_omitted_by_pi_is_not_mirrored_but_a_final_failure_is(
    ledger: Ledger, tmp_path: Path
) -> None:
    path, _, m = started_mirror(ledger, tmp_path)
    write(path, user("u1", "do it"), assistant("bad", "", stop="error", errorMessage="503"))
    anyio.run(m.sync)
    assert [r.seq for r in ledger.iter_rows("s1")] == [1], "held until pi says what it is"
    write(
        path,
        _entry("ed", "context_edit", targetId="bad", replacement=None),
        assistant("bad2", "", stop="error", errorMessage="503 again"),
    )
    anyio.run(m.sync)
    assert m.omitted_attempts == 1
    anyio.run(lambda: m.sync(final=True))
    rows = list(ledger.iter_rows("s1"))
    assert [(r.entry_id, r.body.get("errorMessage")) for r in rows] == [
        (None, None),
        ("bad2", "503 again"),
    ]


class _FailingOnce:
    """The ledger, whose next ``append`` fails as a full disk would."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.fail_next = False

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise StorageError("disk full")
        return self._ledger.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def test_a_failed_pass_is_read_again_whole(ledger: Ledger, tmp_path: Path) -> None:
    # The pass that learns pi omitted an attempt fails to write: the retry must read that
    # context edit again, or it writes the attempt pi left out of its context.
    path = tmp_path / "s.jsonl"
    fence, req = start(ledger)
    flaky = _FailingOnce(ledger)
    m = mirror_for(flaky, fence, path, req)  # type: ignore[arg-type]
    write(path, user("u1", "do it"), assistant("bad", "", stop="error", errorMessage="503"))
    anyio.run(m.sync)
    write(
        path,
        _entry("ed", "context_edit", targetId="bad", replacement=None),
        assistant("ok", "fine"),
    )
    flaky.fail_next = True
    with pytest.raises(StorageError):
        anyio.run(m.sync)
    anyio.run(lambda: m.sync(final=True))
    rows = list(ledger.iter_rows("s1"))
    assert [r.entry_id for r in rows] == [None, "ok"]
    assert m.omitted_attempts == 1


def test_compactions_record_what_they_cover(ledger: Ledger, tmp_path: Path) -> None:
    path, fence, m = started_mirror(ledger, tmp_path)
    write(
        path,
        user("u1", "do it"),
        assistant("a1", "one"),
        assistant("a2", "two"),
        _entry("c1", "compaction", summary="pi's own", firstKeptEntryId="a2", tokensBefore=900),
        assistant("a3", "three"),
        _entry(
            "c2",
            "compaction",
            summary="continuation",
            firstKeptEntryId="c2",
            tokensBefore=1200,
            details={"continuation": {"version": 1, "run": fence.run}},
            fromHook=True,
        ),
    )
    anyio.run(m.sync)
    rows = {r.entry_id: r for r in ledger.iter_rows("s1")}
    own, cont = rows["c1"], rows["c2"]
    assert own.kind is cont.kind is RowKind.COMPACTION
    assert own.covers_to == rows["a2"].seq - 1 == 2
    assert "continuation" not in own.body
    assert own.body["tokens_before"] == 900
    assert cont.covers_to == cont.seq - 1 == 5
    assert cont.body["continuation"] == {"version": 1, "run": fence.run}
    assert cont.body["self_retaining"] is True
    assert cont.body["from_hook"] is True

    receipt = anyio.run(
        m.append_receipt,
        {"kind": "continuation_checkpoint_refused", "run": fence.run, "reason": "empty"},
    )
    assert receipt.kind is RowKind.RECEIPT
    assert receipt.seq == 7
    assert receipt.actor == "agent:rev"


def test_an_omitted_attempt_no_retry_answers_is_the_last_word(
    ledger: Ledger, tmp_path: Path
) -> None:
    path, _, m = started_mirror(ledger, tmp_path)
    write(
        path,
        user("u1", "do it"),
        assistant("cut", "half an answ", stop="length"),
        _entry("ed", "context_edit", targetId="cut", replacement=None),
        _entry("tl", "thinking_level_change", thinkingLevel="off"),
        _entry("cm", "custom_message", customType="ext", content="after it", display=False),
    )
    anyio.run(m.sync)
    assert [r.seq for r in ledger.iter_rows("s1")] == [1], "waits for a retry"
    anyio.run(lambda: m.sync(final=True))
    got = [(r.entry_id, r.role) for r in ledger.iter_rows("s1")]
    assert got == [(None, "user"), ("cut", "assistant"), ("cm", "custom")]
    assert m.omitted_attempts == 0
