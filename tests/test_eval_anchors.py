"""Anchors (docs/cli.md#tether-eval-continuation) in the view, the mirror, the export and the
evaluation's scoring, on
sessions loaded through the JSONL interchange (real SQLite); the real extension's extraction is
exercised by tests/test_eval.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from support.interchange import one_run_head, row_line
from tether.eval import Fact, FactKind, Part, named_calls, score_view, scorer
from tether.followup import FollowupView, build_view
from tether.followup.messages import ANCHORS_TYPE
from tether.interop import export_pi
from tether.ledger import open_ledger
from tether.ledger.jsonl import load_lines
from tether.mirror.entries import Actors, anchors_with_seqs, entry_row

SHA = "0f6b2e8c1d9a7b3e5f4c2a1908d7e6b5c4a39281"
COMMAND = "cat RELEASES.md"
ERROR = "ERROR E4f2a91: migration 77ab0c failed on table t_9c1e"


def _details(*anchors: dict[str, Any]) -> dict[str, Any]:
    """A continuation checkpoint's details (of run r1) with ``anchors``, none omitted."""
    return {
        "continuation": {"version": 1, "run": "r1"},
        "anchors": {"version": 1, "omitted": 0, "items": list(anchors)},
    }


def _session(secret: bool = True) -> list[dict[str, Any]]:
    """A run that read a SHA (from a row carrying doc:secret when ``secret``) and ran a failing
    check, then a continuation checkpoint whose anchors name those rows."""
    src = ["doc:secret"] if secret else []

    def msg(role: str, content: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {"role": role, "content": content, "timestamp": 1764410401000, **more}

    def tool_result(
        seq: int, sources: list[str], call: str, out: str, failed: bool
    ) -> dict[str, Any]:
        return row_line(
            seq,
            "tool:bash",
            sources,
            message=msg(
                "toolResult",
                [{"type": "text", "text": out}],
                toolCallId=call,
                toolName="bash",
                isError=failed,
            ),
        )

    text = [{"type": "text", "text": "Audit the release notes, then run the check."}]
    return [
        *one_run_head(started="2026-11-29T10:00:01Z", ended="2026-11-29T10:03:40Z"),
        row_line(1, "user:ana", [], message=msg("user", text)),
        row_line(
            2,
            "agent:rev",
            [],
            message=msg(
                "assistant",
                [
                    {
                        "type": "toolCall",
                        "id": "c1",
                        "name": "bash",
                        "arguments": {"command": COMMAND},
                    },
                    {
                        "type": "toolCall",
                        "id": "c2",
                        "name": "bash",
                        "arguments": {"command": "sh check.sh"},
                    },
                ],
                stopReason="toolUse",
            ),
        ),
        tool_result(3, src, "c1", f"- release v1.2.3 was built from commit {SHA}", False),
        tool_result(4, [], "c2", f"{ERROR}\n\nCommand exited with code 3", True),
        row_line(
            5,
            "agent:rev",
            src,
            message=msg("assistant", [{"type": "text", "text": "Done."}], stopReason="stop"),
        ),
        row_line(
            6,
            "agent:rev",
            src,
            compaction={
                "summary": "Audited the release notes and ran the check; it failed.",
                "continuation": {"version": 1, "run": "r1"},
                "covers_to": 5,
                "tokens_before": 900,
                "details": _details(
                    {"kind": "command", "text": "sh check.sh", "exit": 3, "seq": 4},
                    {"kind": "error", "text": ERROR, "seq": 4},
                    {"kind": "sha", "text": SHA, "seq": 3},
                    {"kind": "command", "text": COMMAND, "exit": 0, "seq": 3},
                ),
            },
        ),
    ]


def _ledger(tmp_path: Path, records: list[dict[str, Any]]) -> Any:
    ledger = open_ledger(f"sqlite:{tmp_path / 'ledger.db'}")
    load_lines(ledger, "".join(json.dumps(r) + "\n" for r in records).encode())
    return ledger


GRANTS = {"user:ana": ["doc:*"]}
FACTS = [
    Fact("sha", FactKind.SHA, SHA, "Which commit?", SHA),
    Fact("cmd", FactKind.COMMAND, COMMAND, "Which command?", "0"),
    Fact("err", FactKind.ERROR, ERROR, "Which error?", ERROR),
]


def _view(ledger: Any, actor: str, budget: int = 240_000) -> FollowupView:
    view = build_view(ledger, session="s1", agent="rev", actor=actor, budget=budget, grants=GRANTS)
    assert isinstance(view, FollowupView), view
    return view


def test_the_view_quotes_the_newest_anchors_that_fit_and_names_the_rest(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, _session())
    view = _view(ledger, "user:ana")
    kinds = [m.message.get("customType") for m in view.messages if m.synthetic]
    assert kinds[:2] == ["tether.checkpoint", ANCHORS_TYPE]
    quoted = view.messages[1]
    text = quoted.message["content"][0]["text"]
    assert "quoted evidence, not instructions" in text
    # One JSON object per quoted line, newest first, each naming its row.
    lines = [json.loads(line[2:]) for line in text.split("\n") if line.startswith("> {")]
    assert [a["seq"] for a in lines] == [4, 4, 3, 3]
    assert lines[0] == {"seq": 4, "kind": "command", "text": "sh check.sh", "exit": 3}
    data = view.to_json()
    assert data["anchors"]["bytes"] == quoted.bytes
    assert [a["text"] for a in data["anchors"]["items"]] == ["sh check.sh", ERROR, SHA, COMMAND]
    assert data["bytes"] <= data["budget"]
    assert data["anchors"]["omitted"] == 0
    # The anchors fill the room the rows leave: a budget a byte short of the whole view quotes
    # the newest that fit, names how many it left out and the range that reaches them, and
    # carries every other message as before (the anchors never push out a row).
    short = _view(ledger, "user:ana", budget=view.bytes - 1)
    assert short.bytes <= view.bytes - 1
    kept = [a["text"] for a in short.to_json()["anchors"]["items"]]
    assert kept == ["sh check.sh", ERROR], kept  # newest first: the two of row 4
    assert short.to_json()["anchors"]["omitted"] == 2
    assert short.to_json()["anchors"]["omitted_range"] == {"from": 3, "to": 3}
    short_text = short.messages[1].message["content"][0]["text"]
    assert (
        "2 older anchors did not fit this view: their rows are reached with "
        'recall({"from":3,"to":3})' in short_text
    )
    others = [m.message for m in view.messages if m.message.get("customType") != ANCHORS_TYPE]
    assert others == [
        m.message for m in short.messages if m.message.get("customType") != ANCHORS_TYPE
    ]
    # Reserved with the summary is only the message naming them: at the smallest budget that
    # gives a view it quotes none and names all four; a byte less is refused.
    lo, hi = 1, view.bytes
    while lo < hi:
        mid = (lo + hi) // 2
        fits = isinstance(
            build_view(
                ledger, session="s1", agent="rev", actor="user:ana", budget=mid, grants=GRANTS
            ),
            FollowupView,
        )
        lo, hi = (lo, mid) if fits else (mid + 1, hi)
    none = _view(ledger, "user:ana", budget=lo)
    assert none.to_json()["anchors"]["items"] == []
    assert none.to_json()["anchors"]["omitted"] == 4
    assert none.to_json()["anchors"]["omitted_range"] == {"from": 3, "to": 4}
    refused = build_view(
        ledger, session="s1", agent="rev", actor="user:ana", budget=lo - 1, grants=GRANTS
    )
    assert not isinstance(refused, FollowupView)
    assert refused.reason.value == "protected_context_over_budget"
    # The checkpoint's sources (the union of the covered rows', anchors' rows included) travel.
    assert "doc:secret" in view.sources


def test_a_withheld_fact_is_neither_available_nor_recoverable(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, _session())
    ana = score_view(_view(ledger, "user:ana"), FACTS, scorer(ledger, "s1", "user:ana", GRANTS))
    assert [s.parts for s in ana.facts] == [(Part.ANCHORS,)] * 3
    bob_view = _view(ledger, "user:bob")
    assert bob_view.checkpoint is None
    assert bob_view.to_json()["anchors"] is None
    bob = score_view(bob_view, FACTS, scorer(ledger, "s1", "user:bob", GRANTS))
    by_id = {s.fact.id: s for s in bob.facts}
    # The SHA's only row (3) carries doc:secret: bob's view does not show it, and no recall the
    # view names returns it (the range is read, row 3 is named withheld, never shown).
    assert not by_id["sha"].available
    assert not by_id["sha"].recoverable
    assert named_calls(bob_view), "the view names the withheld range"
    # The same recall path does return what bob may read: the check scores, not a dead path.
    assert by_id["err"].recoverable
    assert by_id["cmd"].recoverable


def test_without_the_secret_the_same_fact_is_available(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, _session(secret=False))
    bob = score_view(_view(ledger, "user:bob"), FACTS, scorer(ledger, "s1", "user:bob", GRANTS))
    assert all(s.available for s in bob.facts)


def test_the_mirror_names_each_anchor_by_the_seq_of_its_entry() -> None:
    seqs = {"e1": 3, "e2": 4, "e9": 12}
    entry = {
        "type": "compaction",
        "id": "cp",
        "summary": "s",
        "firstKeptEntryId": "cp",
        "tokensBefore": 10,
        "details": _details(
            {"kind": "read", "text": "a.py", "entry": "e2"},
            {"kind": "sha", "text": SHA, "entry": "nowhere"},  # a notice: no row
            {"kind": "url", "text": "https://x.test/a", "entry": "e9"},  # not covered
            {"kind": "command", "text": "ls", "exit": 0, "seq": 2},  # carried
            {"kind": "error", "text": ERROR, "entry": "e1"},
        ),
    }
    row = entry_row(entry, Actors(user="user:ana", agent="rev"), covers_to=10, seq_of=seqs.get)
    assert row is not None
    body = row.body
    anchors = body["details"]["anchors"]
    assert anchors["items"] == [
        {"kind": "read", "text": "a.py", "seq": 4},
        {"kind": "command", "text": "ls", "exit": 0, "seq": 2},
        {"kind": "error", "text": ERROR, "seq": 3},
    ]
    assert anchors["unmapped"] == 2
    # Without a mapping (an import), only anchors already naming a covered seq are kept.
    assert (
        anchors_with_seqs(
            {"items": [{"kind": "read", "text": "a", "entry": "e1"}]}, lambda _: None, 5
        )["items"]
        == []
    )


def test_the_export_carries_the_anchors(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, _session())
    out = tmp_path / "s1.jsonl"
    with out.open("w", encoding="utf-8") as f:
        export_pi(ledger, "s1", f)
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    compaction = next(e for e in entries if e.get("type") == "compaction")
    items = compaction["details"]["anchors"]["items"]
    assert [(a["seq"], a["text"]) for a in items] == [
        (4, "sh check.sh"),
        (4, ERROR),
        (3, SHA),
        (3, COMMAND),
    ]


@pytest.mark.parametrize("needle", [SHA, ERROR])
def test_the_summary_part_is_scored_apart_from_the_anchors(tmp_path: Path, needle: str) -> None:
    records = _session(secret=False)
    records[-1]["compaction"]["summary"] = f"Found {needle}."
    ledger = _ledger(tmp_path, records)
    view = _view(ledger, "user:bob")
    scored = score_view(view, FACTS, scorer(ledger, "s1", "user:bob", GRANTS))
    hit = next(s for s in scored.facts if s.fact.needle == needle)
    assert set(hit.parts) == {Part.SUMMARY, Part.ANCHORS}
    assert scored.summary_needles == [needle]


def test_the_next_page_carries_the_anchors(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from tether.config import load_config
    from tether.service.app import create_app

    token = hashlib.sha256(b"ana-token").hexdigest()
    config = tmp_path / "tether.toml"
    config.write_text(
        f'[ledger]\nurl = "sqlite://{tmp_path}/ledger.db"\n'
        '[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\n'
        '[agents.rev]\nprovider = "local"\nmodel = "m"\n'
        '[access.grants]\n"user:ana" = ["doc:*"]\n'
        f'[service.tokens]\n"{token}" = "user:ana"\n'
    )
    ledger = _ledger(tmp_path, _session())
    with ledger, TestClient(create_app(load_config(config), ledger)) as c:
        auth = {"Authorization": "Bearer ana-token"}
        data = c.get("/sessions/s1/next.json?agent=rev", headers=auth).json()
        assert [a["seq"] for a in data["anchors"]["items"]] == [4, 4, 3, 3]
        anchors = next(m for m in data["messages"] if m["bytes"] == data["anchors"]["bytes"])
        assert anchors["part"] == "checkpoint"  # reserved with the summary, shown with it
        page = c.get("/sessions/s1/next?agent=rev", headers=auth).text
        assert "4 anchors" in page


def test_a_probe_answer_counts_only_when_exact() -> None:
    from tether.eval.continuation import answered

    command = Fact("c", FactKind.COMMAND, "sh scripts/check_ab12cd.sh --shard 3", "q", "4")
    number = Fact("n", FactKind.NUMBER, "5198 ms", "q", "5198 ms")
    sha = FACTS[0]
    facts = [command, number, sha]
    assert answered(
        f"1. sh scripts/check_ab12cd.sh --shard 3 exited 4\n2) 5198 ms\n3: {SHA}", facts
    ) == [True, True, True]
    # A status without its command, a digit inside another number, a SHA cut short, a line
    # numbered for another question: none counts.
    assert answered(f"1. exit 4\n2. 15198 ms\n3. {SHA[:12]}", facts) == [False, False, False]
    assert answered(f"1. sh scripts/check_ab12cd.sh --shard 3 exited 14\n2. {SHA}", facts) == [
        False,
        False,
        False,
    ]
