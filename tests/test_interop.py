"""pi interop against pi itself: session files the real pi writes (scripted
provider: steering, its own compactions, a branch made by pi's session manager, extension
entries, context edits), imported, compared with pi's own ``buildSessionContext``, exported and
continued by a real pi run, and imported again."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from checkpoint_support import pi_config
from pi_rpc import PiRpc
from provider import Reply, ScriptedProvider, ToolCall, route
from test_pi_format import imported, mirrored
from tether.cli.app import app
from tether.config import AgentConfig, Config, HarnessConfig
from tether.errors import AlreadyExists, InterchangeError
from tether.followup import FollowupView, build_view
from tether.interop import LeftOut, export_pi, import_pi
from tether.ledger import Ledger, RowKind, open_ledger
from tether.ledger.jsonl import dump_session
from tether.pi.install import find_pi
from tether.sizes import canonical_json

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).with_name("pi_session.mjs")
AGENT = "rev"
runner = CliRunner()
# The tests on the session the real pi grows share one worker, so it is grown once.
PI_SESSION = pytest.mark.xdist_group("pi-interop")


# -- pi's own view of a file ------------------------------------------------------------------


_MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs a command as the child of a small process and writes the child's peak RSS (KiB)."""


def pi_tool(*args: str) -> str:
    """Run tests/pi_session.mjs on the Node and the pi package tether itself runs."""
    pi = find_pi()
    done = subprocess.run(
        [str(pi.node), str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "TETHER_PI_DIST": str(pi.cli.parent)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def pi_context(path: Path) -> list[dict[str, Any]]:
    """pi's buildSessionContext messages for the file (its last entry as the leaf)."""
    messages: list[dict[str, Any]] = json.loads(pi_tool("context", str(path)))["messages"]
    return messages


def after_compaction(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pi's context after its newest compaction summary, without prompt state (system
    messages): tether gives every run its own prompt, so its views carry none."""
    cut = max((i for i, m in enumerate(messages) if m["role"] == "compactionSummary"), default=-1)
    return [m for m in messages[cut + 1 :] if m["role"] != "system"]


def check_view_against_pi(store: Ledger, session: str, path: Path) -> FollowupView:
    """tether's view of the imported session against pi's context for the file.

    After the checkpoint, tether carries the rows from its previous request on; rows that pi
    keeps before that request are not carried but named in gap notices (the follow-up builder
    reads its tail after the request). So: what tether carries is exactly the end of pi's
    context, its only other messages are gap notices, and the rows those name are exactly the
    rest of pi's context."""
    view = build_view(store, session=session, agent=AGENT, actor="user:ana", budget=10**7)
    assert isinstance(view, FollowupView), view
    theirs = after_compaction(pi_context(path))
    msgs = list(view.messages)
    cut = max(
        (i for i, m in enumerate(msgs) if m.message.get("customType") == "tether.checkpoint"),
        default=-1,
    )
    ours = msgs[cut + 1 :]
    carried = [m.message for m in ours if not m.synthetic]
    assert all(m.message.get("customType") == "tether.gap" for m in ours if m.synthetic)
    named = [
        row.body
        for gap in view.gaps
        for row in store.rows_range(session, gap.first, gap.last)
        if row.kind is RowKind.MESSAGE and row.body.get("role") != "system"
    ]
    assert canon(named + carried) == canon(theirs)
    assert carried, "the view carries nothing of pi's context"
    return view


def canon(messages: list[dict[str, Any]]) -> list[str]:
    return [canonical_json(m) for m in messages]


def entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- sessions made by the real pi -------------------------------------------------------------


def config(provider: ScriptedProvider, tmp: Path) -> Config:
    return pi_config(
        tmp,
        provider,
        budget=240_000,
        agent=AgentConfig(
            provider="local", model=provider.model, system_prompt="SYS-9d2", tools=["bash"]
        ),
        # keep only a few tokens, so pi's own compaction keeps a short, recent range
        harness=HarnessConfig(
            runs_dir=tmp / "runs",
            workspaces_dir=tmp / "workspaces",
            keep_recent_tokens=5,
            reserve_tokens=2048,
        ),
    )


def _summary(req: Any) -> Reply:
    return Reply("PI-SUMMARY of everything so far (readFiles none)")


TASK = [
    Reply("HELLO-1"),
    Reply(tool_calls=[ToolCall("bash", {"command": "echo two"})]),
    Reply("TWO-DONE"),
    Reply(tool_calls=[ToolCall("bash", {"command": "sleep 1.5; echo slow"})]),
    Reply("STEERED"),
    Reply("FOUR"),
    Reply("FIVE on the abandoned branch"),
    Reply(tool_calls=[ToolCall("bash", {"command": "echo six"})]),
    Reply("SIX-DONE"),
    Reply("SEVEN"),
    Reply("EIGHT after the export"),
]


@pytest.fixture(scope="module")
def pi_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One session grown by the real pi, with a copy of its file after each stage."""
    tmp = tmp_path_factory.mktemp("pi")
    provider = ScriptedProvider(route(task=TASK, summary=_summary)).start()
    cfg = config(provider, tmp)
    f = tmp / "session.jsonl"
    snaps: dict[str, Path] = {}

    def snap(name: str) -> None:
        snaps[name] = tmp / f"{name}.jsonl"
        shutil.copy(f, snaps[name])

    try:
        with PiRpc(f, cfg, AGENT, tmp) as pi:
            pi.prompt("first: say hi")
            pi.prompt("second: run a tool")
            # steering: delivered after the running tool call, inside the turn
            pi.command("prompt", message="third: take your time")
            pi.wait(lambda r: r.get("type") == "tool_execution_start")
            pi.command("steer", message="STEER: change course")
            pi.settled()
            pi.command("compact")  # pi's own compaction (its summarizer, its cut point)
            pi.prompt("fourth")
            pi.prompt("fifth, soon abandoned")
        snap("compacted")
        by_text = {_text(e): e["id"] for e in entries(f) if e["type"] == "message"}
        # a branch the way pi's /tree makes one: back to FOUR, with a summary of the rest
        pi_tool("branch", str(f), by_text["FOUR"], "BRANCH-SUMMARY: tried a fifth thing")
        pi_tool("extras", str(f), by_text["first: say hi"])
        pi_tool("edit", str(f), by_text["STEERED"], json.dumps({"content": "STEERED (edited)"}))
        pi_tool("edit", str(f), by_text["two\n"], "null")
        with PiRpc(f, cfg, AGENT, tmp) as pi:
            pi.command("set_model", provider="local", modelId=provider.model)
            pi.prompt("sixth, on the branch")
        snap("branched")
        with PiRpc(f, cfg, AGENT, tmp) as pi:
            pi.command("compact")
            pi.prompt("seventh")
        snap("twice")
        yield {"tmp": tmp, "cfg": cfg, "provider": provider, "files": snaps}
    finally:
        provider.stop()


def _text(entry: dict[str, Any]) -> str:
    content = entry["message"].get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


def _import(tmp: Path, path: Path, session: str, name: str = "ledger") -> Ledger:
    store = open_ledger(f"sqlite://{tmp}/{name}-{session}.db")
    import_pi(store, path, session=session, agent=AGENT, actor="user:ana")
    return store


# -- the views equal pi's own context ---------------------------------------------------------


@PI_SESSION
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["compacted", "branched", "twice"])
def test_view_after_compaction_equals_pi_context(
    pi_sessions: dict[str, Any], stage: str, tmp_path: Path
) -> None:
    path = pi_sessions["files"][stage]
    store = _import(tmp_path, path, stage)
    with store:
        view = check_view_against_pi(store, stage, path)
        assert view.checkpoint is not None
        # the CLI prints the same view
        done = runner.invoke(
            app,
            [
                "context",
                "-s",
                stage,
                "-a",
                AGENT,
                "--actor",
                "user:ana",
                "--budget",
                "10000000",
                "--json",
                "--ledger",
                store.url,
            ],
        )
        assert done.exit_code == 0, done.output
        shown = json.loads(done.stdout)["messages"]
        assert [(m["role"], m["content"]) for m in shown] == [
            (m.role, m.message.get("content")) for m in view.messages
        ]


@PI_SESSION
@pytest.mark.slow
def test_import_runs_actors_and_what_was_left_out(
    pi_sessions: dict[str, Any], tmp_path: Path
) -> None:
    path = pi_sessions["files"]["twice"]
    store = open_ledger(f"sqlite://{tmp_path}/l.db")
    with store:
        report = import_pi(store, path, session="s", agent=AGENT, actor="user:ana")
        rows = list(store.iter_rows("s"))
        runs = store.runs("s")
        requests = [_text({"message": store.row("s", r.request_seq).body}) for r in runs]  # type: ignore[union-attr]
    # one run per user message that starts a turn; the steering message is inside run 3;
    # the abandoned fifth prompt is off the branch
    assert requests == [
        "first: say hi",
        "second: run a tool",
        "third: take your time",
        "fourth",
        "sixth, on the branch",
        "seventh",
    ]
    steer = next(
        r
        for r in rows
        if r.body.get("content") == [{"type": "text", "text": "STEER: change course"}]
    )
    assert steer.run == runs[2].id
    assert steer.actor == "user:ana"
    assert all(r.run is not None for r in rows if r.body.get("role") != "system")
    assert {r.actor for r in rows if r.body.get("role") == "toolResult"} == {"tool:bash"}
    assert {r.actor for r in rows if r.body.get("role") == "assistant"} == {f"agent:{AGENT}"}
    compactions = [r for r in rows if r.kind is RowKind.COMPACTION]
    assert len(compactions) == report.compactions == 2
    for c in compactions:
        kept = next(r for r in rows if r.entry_id == c.body["first_kept_entry_id"])
        assert c.covers_to == kept.seq - 1
    kinds = {r.body.get("role") for r in rows if r.kind is RowKind.MESSAGE}
    assert {"branchSummary", "custom"} <= kinds
    assert not any("FIVE" in json.dumps(r.body) for r in rows)
    assert report.left_out[LeftOut.OFF_BRANCH] >= 2
    assert report.left_out[LeftOut.CONTEXT_EDIT] == 2
    assert report.left_out[LeftOut.OMITTED_BY_EDIT] == 1
    assert report.edited == 1
    assert {"model_change", "thinking_level_change", "label", "session_info", "custom"} <= set(
        report.bookkeeping
    )


@PI_SESSION
@pytest.mark.slow
def test_imported_and_mirrored_entries_are_the_same_rows(
    pi_sessions: dict[str, Any], tmp_path: Path
) -> None:
    """One mapping of pi's format: the entries of a file the real pi wrote (prompts, a tool
    call, steering, its own compaction; an extension's messages (one without ``display``), a
    label, a name, extension state and a branch summary appended by pi's own SessionManager)
    give the same rows imported (``tether import pi``) as mirrored (a run's mirror reading it)."""
    path = tmp_path / "session.jsonl"
    shutil.copy(pi_sessions["files"]["compacted"], path)
    pi_tool("extras", str(path), entries(path)[-1]["id"])
    pi_tool("quiet", str(path))
    # a branch summary from the leaf itself: the file stays one branch, as a run's file is
    pi_tool("branch", str(path), entries(path)[-1]["id"], "BRANCH-SUMMARY: the way so far")
    written = entries(path)[1:]
    assert {"compaction", "custom_message", "branch_summary", "label", "custom"} <= {
        e["type"] for e in written
    }
    rows = imported(path)
    assert rows == mirrored(path)
    # every conversation entry is a row: the messages, the compaction, the extension's message
    # and the branch summary
    assert [eid for *_, eid in rows] == [
        e["id"]
        for e in written
        if e["type"] in ("message", "compaction", "custom_message", "branch_summary")
    ]
    assert {kind for kind, *_ in rows} == {RowKind.MESSAGE, RowKind.COMPACTION}
    # pi wrote no display for the quiet message, and its context has none: neither has the row
    quiet = next(body for _, _, body, _ in rows if body.get("customType") == "ext.quiet")
    assert "display" not in quiet


# -- export: pi opens it and continues it; the round trip is the identity --------------------


def _normalized_dump(store: Ledger, session: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    dump_session(store, session, out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    run_names = {
        rec["id"]: f"run{i}" for i, rec in enumerate(r for r in records if r["type"] == "run")
    }
    for rec in records:
        if rec["type"] == "session":
            rec["id"] = "S"
        elif rec["type"] == "run":
            rec["id"], rec["session"] = run_names[rec["id"]], "S"
        else:
            rec["session"] = "S"
            if rec.get("run") is not None:
                rec["run"] = run_names[rec["run"]]
    return records


@PI_SESSION
@pytest.mark.slow
def test_import_export_import_is_the_identity(pi_sessions: dict[str, Any], tmp_path: Path) -> None:
    path = pi_sessions["files"]["twice"]
    store = open_ledger(f"sqlite://{tmp_path}/l.db")
    with store:
        import_pi(store, path, session="a", agent=AGENT, actor="user:ana")
        exported = tmp_path / "a.jsonl"
        with exported.open("w") as out:
            export_pi(store, "a", out)
        import_pi(store, exported, session="b", agent=AGENT, actor="user:ana")
        assert _normalized_dump(store, "a") == _normalized_dump(store, "b")
        again = io.StringIO()
        export_pi(store, "b", again)
    assert again.getvalue() == exported.read_text()
    # pi reads the export as it read the original (edits and branch choice already applied)
    assert canon(pi_context(exported)) == canon(pi_context(path))


@PI_SESSION
@pytest.mark.slow
def test_pi_continues_an_exported_session(pi_sessions: dict[str, Any], tmp_path: Path) -> None:
    path = pi_sessions["files"]["twice"]
    provider: ScriptedProvider = pi_sessions["provider"]
    store = open_ledger(f"sqlite://{tmp_path}/l.db")
    with store:
        import_pi(store, path, session="c", agent=AGENT, actor="user:ana")
    exported = tmp_path / "c.jsonl"
    done = runner.invoke(
        app, ["export", "pi", "-s", "c", "-o", str(exported), "--ledger", store.url]
    )
    assert done.exit_code == 0, done.output
    before = entries(exported)
    seen = len(provider.requests)
    with PiRpc(exported, pi_sessions["cfg"], AGENT, tmp_path) as pi:
        pi.prompt("eighth, after the export")
    after = entries(exported)
    # pi appended to the exported file, on its last entry, and sent the model what it holds
    assert after[: len(before)] == before
    new = after[len(before) :]
    assert new
    assert new[0]["parentId"] == before[-1]["id"]
    assert "EIGHT after the export" in json.dumps(new)
    sent = provider.requests[seen]
    assert sent.contains("seventh")
    assert sent.contains("PI-SUMMARY")
    # and the continued file imports again, its new run included
    store = open_ledger(f"sqlite://{tmp_path}/l.db")
    with store:
        report = import_pi(store, exported, session="c2", agent=AGENT, actor="user:ana")
        assert report.runs == 7
        check_view_against_pi(store, "c2", exported)


# -- files pi made before: versions 1 and 2, malformed lines ----------------------------------


def _write(path: Path, records: list[Any]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def _msg(role: str, text: str, ts: int, **kw: Any) -> dict[str, Any]:
    content: Any = text if role == "user" else [{"type": "text", "text": text}]
    return {"role": role, "content": content, "timestamp": ts, **kw}


def test_version_1_and_2_files_are_migrated_as_pi_migrates_them(tmp_path: Path) -> None:
    stamp = "2024-12-03T14:00:00.000Z"
    v1 = _write(
        tmp_path / "v1.jsonl",
        [
            {"type": "session", "id": "old", "timestamp": stamp, "cwd": "/w"},
            {"type": "message", "timestamp": stamp, "message": _msg("user", "one", 1)},
            {"type": "message", "timestamp": stamp, "message": _msg("assistant", "ONE", 2)},
            "{not json",
            {"type": "message", "timestamp": stamp, "message": _msg("user", "two", 3)},
            {"type": "message", "timestamp": stamp, "message": _msg("assistant", "TWO", 4)},
            # pi's v1 index counts the header as entry 0 (and skips the malformed line)
            {
                "type": "compaction",
                "timestamp": stamp,
                "summary": "S1",
                "firstKeptEntryIndex": 3,
                "tokensBefore": 10,
            },
            {"type": "message", "timestamp": stamp, "message": _msg("user", "three", 5)},
            {
                "type": "message",
                "timestamp": stamp,
                "message": {
                    "role": "hookMessage",
                    "customType": "h",
                    "content": "HOOK",
                    "display": True,
                    "timestamp": 6,
                },
            },
        ],
    )
    store = open_ledger("memory:")
    with store:
        report = import_pi(store, v1, session="v1", agent=AGENT, actor="user:ana")
        assert report.version == 1
        assert report.left_out == {LeftOut.MALFORMED: 1}
        compaction = store.latest_compaction("v1")
        assert compaction is not None
        assert compaction.covers_to == 2
        assert store.row("v1", 7).body["role"] == "custom"  # type: ignore[union-attr]
        check_view_against_pi(store, "v1", v1)

    v2 = _write(
        tmp_path / "v2.jsonl",
        [
            {"type": "session", "version": 2, "id": "mid", "timestamp": stamp, "cwd": "/w"},
            {
                "type": "message",
                "id": "a",
                "parentId": None,
                "timestamp": stamp,
                "message": _msg("user", "one", 1),
            },
            {
                "type": "message",
                "id": "b",
                "parentId": "a",
                "timestamp": stamp,
                "message": {
                    "role": "hookMessage",
                    "customType": "h",
                    "content": "HOOK",
                    "display": False,
                    "timestamp": 2,
                },
            },
            {
                "type": "message",
                "id": "c",
                "parentId": "b",
                "timestamp": stamp,
                "message": _msg("assistant", "ONE", 3),
            },
            {
                "type": "message",
                "id": "x",
                "parentId": "a",
                "timestamp": stamp,
                "message": _msg("assistant", "OTHER", 4),
            },
            {
                "type": "message",
                "id": "d",
                "parentId": "c",
                "timestamp": stamp,
                "message": {"role": "user", "content": None, "timestamp": 5},
            },
        ],
    )
    with v2.open("ab") as f:
        # bytes that are not UTF-8 (pi reads them as U+FFFD), and NaN (pi's JSON.parse refuses
        # the line, so the entry before it stays the leaf)
        f.write(
            b'{"type":"message","id":"e","parentId":"d","timestamp":"2024-12-03T14:00:00Z",'
            b'"message":{"role":"assistant","content":[{"type":"text","text":"bad \xff byte"}],'
            b'"timestamp":6}}\n'
            b'{"type":"message","id":"f","parentId":"e","message":{"role":"user",'
            b'"content":"x","timestamp":NaN}}\n'
        )
    store = open_ledger("memory:")
    with store:
        report = import_pi(store, v2, session="v2", agent=AGENT)
        assert report.left_out == {LeftOut.OFF_BRANCH: 1, LeftOut.MALFORMED: 1}
        rows = list(store.iter_rows("v2"))
    assert [r.entry_id for r in rows] == ["a", "b", "c", "d", "e"]
    assert rows[4].body["content"][0]["text"] == "bad \ufffd byte"
    assert rows[1].body["role"] == "custom"
    assert rows[3].body["content"] == []
    assert canon([r.body for r in rows]) == canon(pi_context(v2))


def test_an_entry_time_no_date_can_hold_exports_as_the_time_of_writing(tmp_path: Path) -> None:
    stamp = "2024-12-03T14:00:00.000Z"
    path = _write(
        tmp_path / "far.jsonl",
        [
            {"type": "session", "version": 3, "id": "far", "timestamp": stamp, "cwd": "/w"},
            {"type": "message", "id": "a1", "parentId": None, "message": _msg("user", "hi", 3e14)},
        ],
    )
    store = open_ledger("memory:")
    with store:
        import_pi(store, path, session="far", agent=AGENT, actor="user:ana")
        out = io.StringIO()
        export_pi(store, "far", out)
    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["type"] for e in entries] == ["session", "message", "custom"]  # its run, after it
    assert entries[1]["timestamp"].endswith("Z")  # a date pi can parse, not a crash
    assert entries[2]["timestamp"] == entries[1]["timestamp"]  # the run has no end: the entry's


def test_a_bad_file_or_a_taken_session_writes_nothing(tmp_path: Path) -> None:
    not_pi = _write(tmp_path / "x.jsonl", [{"type": "message", "id": "a"}])
    bad_message = _write(
        tmp_path / "y.jsonl",
        [
            {"type": "session", "version": 3, "id": "y", "timestamp": "2024-12-03T14:00:00Z"},
            {"type": "message", "id": "a", "parentId": None, "message": _msg("user", "hi", 1)},
            {"type": "message", "id": "b", "parentId": "a", "message": {"content": "no role"}},
        ],
    )
    store = open_ledger("memory:")
    with store:
        with pytest.raises(InterchangeError, match="not a pi session file"):
            import_pi(store, not_pi, session="x", agent=AGENT)
        with pytest.raises(InterchangeError, match=r"y.jsonl:3: .*no message with a role"):
            import_pi(store, bad_message, session="y", agent=AGENT)
        assert store.session("x") is None
        assert store.session("y") is None
        store.create_session("taken")
        with pytest.raises(AlreadyExists):
            import_pi(store, bad_message, session="taken", agent=AGENT)
    done = runner.invoke(
        app, ["import", "pi", str(not_pi), "-s", "z", "-a", AGENT, "--ledger", "memory:"]
    )
    assert done.exit_code == 2  # a bad input file is a usage error, nothing written (issue 12)
    assert "not a pi session file" in done.output


@pytest.mark.slow
def test_import_of_a_large_file_streams(tmp_path: Path) -> None:
    """10^5 entries (a 100 MB file) import in bounded memory: the shape of each entry is held,
    never the bodies (reading the whole file would take five times the peak allowed here)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from interop import write_pi_file  # bench/interop.py: the same file the benchmark uses

    path = tmp_path / "big.jsonl"
    n = write_pi_file(path, 100_000)
    size = path.stat().st_size
    db = f"sqlite://{tmp_path}/big.db"
    with (tmp_path / "out.json").open("wb") as out, (tmp_path / "err.txt").open("wb") as err:
        # A small parent runs the import and reports its child's peak RSS: a child forked
        # straight from this (large, long-lived) test process would count this process's
        # pages as its own until it execs, and ru_maxrss keeps that peak across the exec.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _MEASURE,
                str(tmp_path / "rss.txt"),
                sys.executable,
                "-m",
                "tether",
                "import",
                "pi",
                str(path),
                "-s",
                "big",
                "-a",
                AGENT,
                "--ledger",
                db,
                "--json",
            ],
            stdout=out,
            stderr=err,
        )
        proc.wait()
    assert proc.returncode == 0, (tmp_path / "err.txt").read_text()
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["entries"] == n
    assert report["left_out"]["off_branch"] == 1000
    with open_ledger(db) as store:
        assert store.last_seq("big") == report["rows"] > 0.95 * n - 1000
    peak = int((tmp_path / "rss.txt").read_text()) * 1024
    assert peak < 0.2 * size + 100_000_000, f"peak RSS {peak / 1e6:.0f} MB for {size / 1e6:.0f} MB"


@pytest.mark.slow
def test_a_tether_session_exports_to_a_file_pi_continues(
    scripted_provider: Any, tmp_path: Path
) -> None:
    """A session tether ran (a continuation checkpoint, then a follow-up): pi's context for the
    exported file is the checkpoint's summary and the rows after what it covers, and a real pi
    run continues the file."""
    import checkpoint_support as cs

    provider = scripted_provider(
        route(
            task=[*cs.long_task(), Reply("second answer"), Reply("THIRD, in pi")],
            summary=[Reply(cs.SUMMARY)],
        )
    )
    cfg = cs.config(tmp_path, provider)
    store = open_ledger(cfg.ledger.url)
    with store:
        assert cs.run(store, cfg, tmp_path).checkpoint.status == "written"
        cs.run(store, cfg, tmp_path, text="What did you count to?", checkpoint=None)
        [checkpoint] = cs.rows_of(store, "s1", RowKind.COMPACTION)
        kept = [
            r.body
            for r in store.iter_rows("s1")
            if r.seq > checkpoint.covers_to  # type: ignore[operator]
            and r.kind is RowKind.MESSAGE
            and r.body.get("role") != "system"
        ]
        exported = tmp_path / "s1.jsonl"
        with exported.open("w") as out:
            report = export_pi(store, "s1", out)
    assert report.runs == 2
    context = pi_context(exported)
    summaries = [m for m in context if m["role"] == "compactionSummary"]
    assert [m["summary"] for m in summaries] == [cs.SUMMARY]
    assert canon(after_compaction(context)) == canon(kept)
    before = entries(exported)
    with PiRpc(exported, cfg, cs.AGENT, tmp_path) as pi:
        pi.prompt("And a third question, in pi itself")
    new = entries(exported)[len(before) :]
    assert new[0]["parentId"] == before[-1]["id"]
    assert "THIRD, in pi" in json.dumps(new)
    sent = provider.task_requests[-1]
    assert sent.contains("SUMMARY-MARK-5c1e")
    assert sent.contains("second answer")


def test_import_and_export_on_every_backend(ledger: Ledger, tmp_path: Path) -> None:
    stamp = "2024-12-03T14:00:00.000Z"
    path = _write(
        tmp_path / "s.jsonl",
        [
            {"type": "session", "version": 3, "id": "p", "timestamp": stamp, "cwd": "/w"},
            {"type": "model_change", "id": "m", "parentId": None, "timestamp": stamp}
            | {"provider": "local", "modelId": "x"},
            {"type": "message", "id": "a", "parentId": "m", "timestamp": stamp}
            | {"message": _msg("user", "one", 1)},
            {"type": "message", "id": "b", "parentId": "a", "timestamp": stamp}
            | {"message": _msg("assistant", "ONE", 2)},
            {"type": "compaction", "id": "c", "parentId": "b", "timestamp": stamp}
            | {"summary": "S", "firstKeptEntryId": "b", "tokensBefore": 3},
            {
                "type": "custom",
                "id": "r",
                "parentId": "c",
                "timestamp": stamp,
                "customType": "tether.receipt",
            }
            | {"data": {"kind": "continuation_checkpoint_refused", "run": "r1", "reason": "empty"}},
            {"type": "label", "id": "l", "parentId": "r", "timestamp": stamp}
            | {"targetId": "a", "label": "here"},
        ],
    )
    report = import_pi(ledger, path, session="p", agent=AGENT, actor="user:ana")
    assert (report.rows, report.runs, report.bookkeeping) == (
        4,
        1,
        {"model_change": 1, "label": 1},
    )
    rows = list(ledger.iter_rows("p"))
    assert [r.kind for r in rows] == [
        RowKind.MESSAGE,
        RowKind.MESSAGE,
        RowKind.COMPACTION,
        RowKind.RECEIPT,
    ]
    assert rows[0].extra["pi_before"][0]["type"] == "model_change"
    assert rows[2].covers_to == 1
    assert ledger.get_session("p").extra["pi_after"][0]["label"] == "here"
    out = io.StringIO()
    export_pi(ledger, "p", out)
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    # the entries imported, and the run's record right after its last row
    [run] = [e for e in written if e.get("customType") == "tether.run"]
    assert (run["type"], run["parentId"], run["timestamp"]) == ("custom", "r", stamp)
    assert run["data"] == {"status": "finished", "started": stamp, "ended": stamp} | {
        "first": "a",
        "last": "r",
        "request": "a",
    }
    original = entries(path)
    assert [e for e in written if e is not run] == [
        *original[:-1],
        {**original[-1], "parentId": run["id"]},
    ]


def test_a_session_tether_wrote_exports_and_imports_back_row_for_row(tmp_path: Path) -> None:
    """Rows that never came from a pi file (no entry ids, message timestamps of their own)
    come back with the same bodies, kinds, coverage and runs."""
    from tether.ledger import NewRow, RunStatus

    store = open_ledger("memory:")
    with store:
        store.create_session("t")
        fence = store.claim_run(store.create_run("t", AGENT).id)
        call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "ls"}}
        store.append(fence, [NewRow.message("user:ana", _msg("user", "go", 1_700_000_000_001))])
        store.append(
            fence,
            [
                NewRow.message("agent:rev", _msg("system", "prompt", 5)),
                NewRow.message("agent:rev", {**_msg("assistant", "", 7), "content": [call]}),
                NewRow.message(
                    "tool:bash",
                    {**_msg("toolResult", "a b", 8), "toolCallId": "c1", "toolName": "bash"},
                ),
                NewRow.message(
                    "agent:rev",
                    {"role": "custom", "customType": "x", "content": "c", "display": False}
                    | {"timestamp": 123_456},
                ),
                NewRow.message(
                    "agent:rev",
                    {"role": "branchSummary", "summary": "b", "fromId": "f", "timestamp": 9},
                ),
                # a field pi's custom_message entry has no place for: written as a message entry
                NewRow.message(
                    "agent:rev",
                    {"role": "custom", "customType": "y", "content": [], "timestamp": 11}
                    | {"origin": "elsewhere"},
                ),
                NewRow.message("agent:rev", _msg("assistant", "done", 10)),
                NewRow(
                    "agent:rev",
                    RowKind.COMPACTION,
                    {"summary": "S", "covers_to": 7, "tokens_before": 5}
                    | {"continuation": {"version": 1, "run": fence.run}},
                ),
                NewRow(
                    "agent:rev",
                    RowKind.RECEIPT,
                    {
                        "kind": "continuation_checkpoint_refused",
                        "run": fence.run,
                        "reason": "empty",
                    },
                ),
            ],
        )
        store.end_run(fence, RunStatus.FINISHED)
        out = tmp_path / "t.jsonl"
        with out.open("w") as f:
            export_pi(store, "t", f)
        report = import_pi(store, out, session="t2", agent=AGENT, actor="user:ana")
        first, second = list(store.iter_rows("t")), list(store.iter_rows("t2"))
    assert report.runs == 1
    assert [(r.kind, r.actor, r.body.get("covers_to")) for r in first] == [
        (r.kind, r.actor, r.body.get("covers_to")) for r in second
    ]
    assert [r.body for r in first if r.kind is not RowKind.COMPACTION] == [
        r.body for r in second if r.kind is not RowKind.COMPACTION
    ]
    assert second[8].body["summary"] == "S"
    assert second[8].body["continuation"] == {"version": 1, "run": first[0].run}
    kinds = [json.loads(line)["type"] for line in out.read_text().splitlines()]
    assert kinds.count("custom_message") == 1
    assert kinds.count("branch_summary") == 1


@pytest.mark.slow
def test_runs_tether_made_survive_export_and_import(scripted_provider: Any, tmp_path: Path) -> None:
    """Three runs of the real pi (two end with a continuation checkpoint, so the next run's
    view copies the previous request as a new row), `tether export pi`, then `tether import
    pi`: three runs again, each with its status, request, rows and times."""
    import checkpoint_support as cs

    provider = scripted_provider(
        route(
            task=[*cs.long_task("one"), *cs.long_task("two"), Reply("three")],
            summary=[Reply(cs.SUMMARY), Reply(cs.SUMMARY)],
        )
    )
    cfg = cs.config(tmp_path, provider)
    with open_ledger(cfg.ledger.url) as store:
        for text in ("first?", "second?", "third?"):
            assert cs.run(store, cfg, tmp_path, text=text).status == "finished"
        before = store.runs("s1")
        copied = [r for r in store.iter_rows("s1") if "origin" in r.extra]
    assert len(copied) == 2  # the previous requests the second and third runs copied
    path = tmp_path / "s1.jsonl"
    ledger = ["--ledger", cfg.ledger.url]
    done = runner.invoke(app, ["export", "pi", "--session", "s1", "-o", str(path), *ledger])
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert "exported 17 rows and 3 runs of session s1" in said
    assert "not in the file: 0 runs not ended" in said
    done = runner.invoke(app, ["import", "pi", str(path), "-s", "s2", "-a", AGENT, *ledger])
    assert done.exit_code == 0, done.output
    assert "in 3 runs" in done.output
    with open_ledger(cfg.ledger.url) as store:
        after = store.runs("s2")
        rows = {s: list(store.iter_rows(s)) for s in ("s1", "s2")}

    def ms(stamp: str | None) -> int | None:
        return None if stamp is None else int(datetime.fromisoformat(stamp).timestamp() * 1000)

    assert [(r.status, r.request_seq) for r in after] == [(r.status, r.request_seq) for r in before]
    assert [(ms(r.started), ms(r.ended)) for r in after] == [
        (ms(r.started), ms(r.ended)) for r in before
    ]
    names = {new.id: old.id for new, old in zip(after, before, strict=True)}
    assert [(names.get(r.run), r.body) for r in rows["s2"]] == [(r.run, r.body) for r in rows["s1"]]
    # pi's context for the file is the ledger's: the run entries are not in it
    assert not any("tether.run" in json.dumps(m) for m in pi_context(path))
