"""The run lifecycle against the real pi (and a misbehaving fake one) with the scripted provider."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from provider import (
    Fail,
    Reply,
    ScriptedProvider,
    Stall,
    ToolCall,
    empty,
    overflow,
    route,
    truncated,
)
from tether.clock import ManualClock
from tether.config import Config
from tether.errors import ConfigError
from tether.events import PiStarted, RunEvent, RunStarted, Settled, ToolStarted
from tether.harness.ending import PiRecord, RunEnd, Strays
from tether.harness.run import RunOutcome, RunRequest, execute_run
from tether.harness.stops import StopControl, StopReason
from tether.ledger import Ledger, Row, RowKind, RunStatus, open_ledger
from tether.pi.install import PiInstall

FAKE_PI = Path(__file__).with_name("fake_pi.py")
FAKE_NODE = Path(__file__).with_name("fake_node.py")


def make_config(tmp: Path, url: str, *, window: int = 8192, **agent: Any) -> Config:
    return Config.model_validate(
        {
            "providers": {"local": {"base_url": url, "context_window": window, "max_tokens": 1024}},
            "agents": {"rev": {"provider": "local", "model": "scripted", **agent}},
            "harness": {
                "runs_dir": str(tmp / "runs"),
                "workspaces_dir": str(tmp / "workspaces"),
                "stop_grace_s": 5,
                "pi_settings": {"retry": {"baseDelayMs": 20}},
            },
        }
    )


def workdir_in(tmp: Path) -> Path:
    """The agent's workdir: beside the ledger and the run directories, never around them."""
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    return work


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Ledger]:
    ledger = open_ledger(f"sqlite://{tmp_path}/ledger.db")
    yield ledger
    ledger.close()


def rows(ledger: Ledger, session: str = "s1") -> list[Row]:
    return list(ledger.iter_rows(session))


def run_sync(
    ledger: Ledger, config: Config, text: str, tmp: Path, **kw: Any
) -> tuple[RunOutcome, list[RunEvent]]:
    events: list[RunEvent] = []
    request = RunRequest(
        session=kw.pop("session", "s1"),
        agent="rev",
        text=text,
        actor=kw.pop("actor", "user:ana"),
        workdir=workdir_in(tmp),
        extensions=kw.pop("extensions", ()),
    )

    async def go() -> RunOutcome:
        return await execute_run(ledger, config, request, subscribers=[events.append], **kw)

    return anyio.run(go), events


def test_a_manual_clock_tells_when_someone_sleeps_on_it() -> None:
    clock = ManualClock()
    woke: list[float] = []

    async def sleeper(until: float) -> None:
        await clock.sleep_until(until)
        woke.append(clock.now())

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            assert clock.asleep == 0
            tg.start_soon(sleeper, 5.0)
            tg.start_soon(sleeper, 9.0)
            with anyio.fail_after(5):
                await clock.sleepers(2)
                await clock.sleepers(1, at=9.0)
            assert clock.asleep == 2
            clock.advance(5)
            with anyio.fail_after(5):
                while not woke:  # the woken task runs on a later turn of the loop
                    await anyio.lowlevel.checkpoint()
            assert woke == [5.0]
            assert clock.asleep == 1
            # Nobody sleeps until 5 any more: a wait for one times out.
            with anyio.move_on_after(0.1) as waited:
                await clock.sleepers(1, at=5.0)
            assert waited.cancelled_caught
            tg.cancel_scope.cancel()
        assert clock.asleep == 0  # a cancelled sleeper is no longer counted

    anyio.run(go)


def test_the_end_record_writes_the_run_extra_it_always_wrote() -> None:
    base = {
        "stop_reason": "completed",
        "answer": None,
        "error": None,
        "checkpoint": "not_needed",
        "turns": 1,
        "tool_calls": 0,
        "retries": 0,
        "omitted_attempts": 0,
        "pi": {"version": "1.6.0", "exit_status": None},
        "log": "/runs/r1/pi.log",
        "ended_by_harness": "2026-01-01T00:00:00Z",
    }
    pi = PiRecord(version="1.6.0", exit_status=None)
    plain = RunEnd(**{**base, "pi": pi})
    # Every key always written is there (None included), in its order; no optional key is.
    assert list(plain.to_extra().items()) == list(base.items())
    full = RunEnd(
        **{**base, "pi": pi},
        view={"budget": 10},
        escalated=True,
        strays=Strays(count=2, samples=["a"]),
        extension_errors=["e"],
        mirror_problems=["m"],
        storage_retries=3,
    )
    assert full.to_extra() == {
        **base,
        "view": {"budget": 10},
        "escalated": True,
        "strays": {"count": 2, "samples": ["a"]},
        "extension_errors": ["e"],
        "mirror_problems": ["m"],
        "storage_retries": 3,
    }


def test_multi_turn_run_records_tool_calls_in_order(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    (workdir_in(tmp_path) / "notes.txt").write_text("the notes file\n")
    p = scripted_provider(
        [
            Reply(
                "Looking.", tool_calls=[ToolCall("bash", {"command": "echo from-bash"}, id="c1")]
            ),
            Reply(tool_calls=[ToolCall("read", {"path": "notes.txt"}, id="c2")]),
            Reply("Both done: from-bash, the notes file."),
        ]
    )
    outcome, events = run_sync(store, make_config(tmp_path, p.url), "check things", tmp_path)

    assert outcome.status is RunStatus.FINISHED
    assert outcome.stop_reason is StopReason.SETTLED
    assert outcome.answer == "Both done: from-bash, the notes file."
    got = rows(store)
    assert [r.seq for r in got] == list(range(1, len(got) + 1))
    run = store.get_run(outcome.run)
    assert run.status is RunStatus.FINISHED
    assert run.request_seq == 1
    assert got[0].actor == "user:ana"
    assert got[0].body["content"] == [{"type": "text", "text": "check things"}]
    convo = [(r.actor, r.role) for r in got if r.role != "system"]
    assert convo == [
        ("user:ana", "user"),
        ("agent:rev", "assistant"),
        ("tool:bash", "toolResult"),
        ("agent:rev", "assistant"),
        ("tool:read", "toolResult"),
        ("agent:rev", "assistant"),
    ]
    by_role = [r for r in got if r.role in ("assistant", "toolResult")]
    calls = [b["id"] for r in by_role for b in r.body["content"] if b.get("type") == "toolCall"]
    results = [r.body["toolCallId"] for r in by_role if r.role == "toolResult"]
    assert calls == results == ["c1", "c2"]
    assert "from-bash" in json.dumps(by_role[1].body)
    assert "the notes file" in json.dumps(by_role[3].body)
    assert all(r.entry_id for r in got[1:]), "mirrored rows carry pi's entry ids"
    assert [e.name for e in events if isinstance(e, ToolStarted)] == ["bash", "read"]
    assert len(p.requests) == 3
    assert run.extra["turns"] == 3
    assert run.extra["tool_calls"] == 2


def test_a_failure_in_following_pi_s_records_stops_pi_and_is_the_run_s_error(
    tmp_path: Path,
    store: Ledger,
    scripted_provider: Callable[..., ScriptedProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run follows pi's records in the RPC client's reader (a listener, not a task): a bug
    there still stops pi and ends the run with the harness's failure, as a failing task does,
    not as pi's output failing, and the request row is kept."""
    from tether.harness import pump

    following = pump.on_record

    def breaks_at_the_tool(item: Any, state: Any, **kw: Any) -> None:
        if isinstance(item, dict) and item.get("type") == "tool_execution_start":
            raise RuntimeError("following broke")
        following(item, state, **kw)

    monkeypatch.setattr(pump, "on_record", breaks_at_the_tool)
    p = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": "sleep 30"})]), Reply("never")]
    )
    started = time.monotonic()
    outcome, _ = run_sync(store, make_config(tmp_path, p.url), "go", tmp_path)
    assert time.monotonic() - started < 25, "pi and its sleep were stopped, not waited for"
    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason is StopReason.PROTOCOL_ERROR
    assert outcome.error is not None
    assert "the harness failed: following broke" in outcome.error
    assert rows(store)[0].body["content"] == [{"type": "text", "text": "go"}]


def test_follow_up_sees_the_exact_previous_request(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    first = "Count the files — exactly\u2028as written"
    p = scripted_provider([Reply("There are 3."), Reply("Still 3.")])
    config = make_config(tmp_path, p.url)
    one, _ = run_sync(store, config, first, tmp_path)
    two, _ = run_sync(store, config, "And now?", tmp_path, actor="user:bob")

    assert one.status is two.status is RunStatus.FINISHED
    assert two.follow_up
    assert not one.follow_up
    sent = p.requests[1]
    assert sent.user_texts == [first, "And now?"]
    assert sent.contains("There are 3.")
    run = store.get_run(two.run)
    assert run.extra["view"]["previous_request"] == {
        "seq": 1,
        "run": one.run,
        "actor": "user:ana",
        "mode": "reused",
    }
    request_row = store.row("s1", run.request_seq or 0)
    assert request_row is not None
    assert request_row.actor == "user:bob"
    assert request_row.run == two.run
    texts = [r.body["content"][0]["text"] for r in rows(store) if r.role == "user"]
    assert texts == [first, "And now?"], "the reused history is not written again"


def test_follow_up_with_a_gap_copies_the_view_as_new_rows(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    big = "x" * 6000
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": f"echo {big}"})]),
            Reply(tool_calls=[ToolCall("bash", {"command": f"echo {big}"})]),
            Reply("first done"),
            Reply("second done"),
        ]
    )
    # a window large enough that pi never compacts on its own here
    config = make_config(tmp_path, p.url, window=128_000).model_copy(
        update={"followup": Config().followup.model_copy(update={"budget_bytes": 9000})}
    )
    run_sync(store, config, "make output", tmp_path)
    before = rows(store)
    two, _ = run_sync(store, config, "what happened?", tmp_path)
    assert two.status is RunStatus.FINISHED
    view = store.get_run(two.run).extra["view"]
    assert view["previous_request"]["mode"] == "copied"
    assert view["gaps"], "a gap is named"
    copies = [r for r in rows(store) if r.run == two.run and "origin" in r.extra]
    assert len(copies) == view["copied"] > 0
    originals = {r.seq: r for r in before}
    for copy in copies:
        original = originals[copy.extra["origin"]]
        assert copy.actor == original.actor
        assert copy.body == original.body
    assert copies[0].body["content"][0]["text"] == "make output"
    assert p.requests[-1].user_texts[0] == "make output"
    assert p.requests[-1].user_texts[-1] == "what happened?"
    # pi's own entries of the second run are mirrored once, the pre-written ones never
    second = [r for r in rows(store) if r.run == two.run and "origin" not in r.extra]
    assert [r.role for r in second] == ["user", "system", "assistant"]


def test_retry_after_agent_end_is_not_the_end(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Fail(503, "overloaded"), Reply("recovered answer")])
    outcome, _ = run_sync(store, make_config(tmp_path, p.url), "hello", tmp_path)
    assert outcome.status is RunStatus.FINISHED
    assert outcome.answer == "recovered answer"
    run = store.get_run(outcome.run)
    assert run.extra["retries"] == 1
    assert run.extra["omitted_attempts"] == 1
    assistants = [r for r in rows(store) if r.role == "assistant"]
    assert [a.body["stopReason"] for a in assistants] == ["stop"]
    assert len(p.requests) == 2


def test_overflow_recovery_compacts_and_continues(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        route(task=[overflow(), Reply("after overflow")], summary=[Reply("SUMMARY of the work")])
    )
    outcome, _ = run_sync(store, make_config(tmp_path, p.url), "big " + "word " * 4000, tmp_path)
    assert outcome.status is RunStatus.FINISHED
    assert outcome.answer == "after overflow"
    assert len(p.summary_requests) == 1
    assert len(p.task_requests) == 2
    got = rows(store)
    compactions = [r for r in got if r.kind is RowKind.COMPACTION]
    assert len(compactions) == 1
    body = compactions[0].body
    assert "SUMMARY of the work" in body["summary"]
    assert "continuation" not in body
    # pi keeps only the failed attempt (omitted from context, so not a row): the compaction
    # covers every row before it, the request included, which the summary request carried.
    assert body["first_kept_entry_id"] not in {r.entry_id for r in got}
    assert body["covers_to"] == compactions[0].seq - 1
    assert p.summary_requests[0].contains("big word word")
    assert got[-1].role == "assistant"
    assert got[-1].body["content"][0]["text"] == "after overflow"


def test_unreachable_provider_fails_the_run_and_keeps_the_request(
    tmp_path: Path, store: Ledger
) -> None:
    config = make_config(tmp_path, "http://127.0.0.1:9/v1")
    outcome, _ = run_sync(store, config, "anyone there?", tmp_path)
    assert outcome.status is RunStatus.FAILED
    assert outcome.error is not None
    assert "provider failed" in outcome.error
    run = store.get_run(outcome.run)
    assert run.extra["error"] == outcome.error
    assert run.extra["retries"] == 3
    first = store.row("s1", run.request_seq or 0)
    assert first is not None
    assert first.body["content"][0]["text"] == "anyone there?"


def test_broken_extension_is_a_startup_failure(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    bad = tmp_path / "broken.ts"
    bad.write_text("export default function (pi) { throw new Error('boom at load'); }\n")
    p = scripted_provider([Reply("never")])
    outcome, _ = run_sync(store, make_config(tmp_path, p.url), "hello", tmp_path, extensions=(bad,))
    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason is StopReason.STARTUP_FAILED
    assert outcome.error is not None
    assert "boom at load" in outcome.error
    assert p.requests == []
    assert [r.role for r in rows(store)] == ["user"]
    log = (outcome.run_dir / "pi.log").read_text()
    assert "boom at load" in log


async def _wait_for(predicate: Callable[[], bool], limit_s: float = 20) -> None:
    # Polls state that other threads and processes change (the provider, files, pids).
    with anyio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.02)


def test_deadline_aborts_and_keeps_the_answer(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        [Reply("progress so far", tool_calls=[ToolCall("bash", {"command": "true"})]), Stall()]
    )
    config = make_config(tmp_path, p.url, deadline_s=3600)
    clock = ManualClock()

    async def go() -> RunOutcome:
        async with anyio.create_task_group() as tg:
            result: list[RunOutcome] = []

            async def run() -> None:
                request = RunRequest(
                    session="s1", agent="rev", text="work", workdir=workdir_in(tmp_path)
                )
                result.append(await execute_run(store, config, request, clock=clock))

            tg.start_soon(run)
            await _wait_for(lambda: len(p.requests) == 2)
            with anyio.fail_after(20):
                await clock.sleepers(1, at=3600.0)  # the run waits for its deadline
            clock.advance(3600)
        return result[0]

    outcome = anyio.run(go)
    assert outcome.status is RunStatus.INTERRUPTED
    assert outcome.stop_reason is StopReason.DEADLINE
    assert outcome.answer == "progress so far"
    run = store.get_run(outcome.run)
    assert run.extra["stop_reason"] == "deadline"
    assert "escalated" not in run.extra
    assert store.get_session("s1").refusing is None
    assert [r.role for r in rows(store) if r.role != "system"][:4] == [
        "user",
        "assistant",
        "toolResult",
        "assistant",
    ]


def _run_until(
    store: Ledger,
    config: Config,
    tmp: Path,
    ready: Callable[[list[RunEvent]], bool],
    act: Callable[[StopControl, list[RunEvent]], None],
    **kw: Any,
) -> tuple[RunOutcome, list[RunEvent]]:
    events: list[RunEvent] = []

    async def go() -> RunOutcome:
        stop = StopControl()
        result: list[RunOutcome] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                request = RunRequest(
                    session="s1", agent="rev", text="work", workdir=workdir_in(tmp)
                )
                result.append(
                    await execute_run(
                        store, config, request, stop=stop, subscribers=[events.append], **kw
                    )
                )

            tg.start_soon(run)
            await _wait_for(lambda: ready(events))
            act(stop, events)
        return result[0]

    return anyio.run(go), events


def test_soft_stop_aborts_waits_and_keeps_the_answer(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        [Reply("step one done", tool_calls=[ToolCall("bash", {"command": "true"})]), Stall()]
    )
    outcome, _ = _run_until(
        store,
        make_config(tmp_path, p.url),
        tmp_path,
        ready=lambda _: len(p.requests) == 2,
        act=lambda stop, _: stop.soft(),
    )
    assert outcome.status is RunStatus.INTERRUPTED
    assert outcome.stop_reason is StopReason.SOFT_STOP
    assert outcome.answer == "step one done"
    run = store.get_run(outcome.run)
    assert run.extra["pi"]["exit_status"] == 0, "pi settled and exited on its own"
    aborted = [r for r in rows(store) if r.body.get("stopReason") == "aborted"]
    assert len(aborted) == 1, "the aborted attempt is recorded"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _pids_naming(marker: str) -> list[int]:
    """Host pids of the live shells whose command line names ``marker``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status", "name"]):
        argv = proc.info["cmdline"] or []
        live = proc.info["status"] != psutil.STATUS_ZOMBIE
        if live and proc.info["name"] in ("bash", "sh") and any(marker in a for a in argv):
            found.append(proc.pid)
    return found


def test_hard_stop_kills_pi_and_its_tools(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    # The tool runs sandboxed: it writes where it can (the session's workspace), and its pid as
    # the host sees it is found by the marker on its command line (inside, it has a pid of its
    # own).
    pidfile = tmp_path / "workspaces" / "s1" / "tree" / "tool.pid"
    marker = f"tether-hard-stop-{time.monotonic_ns()}"
    command = f"echo $$ > {pidfile}; sleep 60; : {marker}"
    p = scripted_provider(
        [
            Reply("starting a long command", tool_calls=[ToolCall("bash", {"command": command})]),
            Reply("never reached"),
        ]
    )
    host_pids: list[int] = []

    def tool_started(_: list[RunEvent]) -> bool:
        if not (pidfile.exists() and pidfile.read_text().strip() != ""):
            return False
        host_pids[:] = _pids_naming(marker)
        return bool(host_pids)

    outcome, events = _run_until(
        store,
        make_config(tmp_path, p.url),
        tmp_path,
        ready=tool_started,
        act=lambda stop, _: stop.stop_hard(),
    )
    assert outcome.status is RunStatus.INTERRUPTED
    assert outcome.stop_reason is StopReason.HARD_STOP
    assert outcome.answer == "starting a long command"
    pi_pid = next(e.pid for e in events if isinstance(e, PiStarted))
    assert not _alive(pi_pid)
    (tool_pid,) = host_pids
    anyio.run(_wait_for, lambda: not _alive(tool_pid), 5)
    assert len(p.requests) == 1


def test_pi_killed_mid_run_fails_the_run_and_keeps_what_it_wrote(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        [Reply("first part", tool_calls=[ToolCall("bash", {"command": "true"})]), Stall()]
    )

    def kill(stop: StopControl, events: list[RunEvent]) -> None:
        pid = next(e.pid for e in events if isinstance(e, PiStarted))
        os.killpg(pid, signal.SIGKILL)

    outcome, _ = _run_until(
        store,
        make_config(tmp_path, p.url),
        tmp_path,
        ready=lambda _: len(p.requests) == 2,
        act=kill,
    )
    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason is StopReason.TRANSPORT_LOST
    assert outcome.answer == "first part"
    assert outcome.error is not None
    assert "pi went away" in outcome.error
    roles = [r.role for r in rows(store) if r.role != "system"]
    assert roles == ["user", "assistant", "toolResult"]


def fake_pi() -> PiInstall:
    return PiInstall(node=FAKE_NODE, cli=FAKE_PI, version="fake")


def test_fake_pi_printing_malformed_lines(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, events = run_sync(
        store,
        make_config(tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "garbage"}),
        "hello",
        tmp_path,
        pi=fake_pi(),
    )
    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason is StopReason.TRANSPORT_LOST
    run = store.get_run(outcome.run)
    strays = run.extra["strays"]
    assert strays["count"] == 4
    assert strays["samples"][0] == "this is not json"
    assert strays["samples"][-1] == '{"type": "agent_start"'
    assert [type(e).__name__ for e in events].count("StrayOutput") == 4


def test_fake_pi_flooding_stdout_is_a_protocol_error(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, _ = run_sync(
        store,
        make_config(tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "flood"}),
        "hello",
        tmp_path,
        pi=fake_pi(),
    )
    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason is StopReason.PROTOCOL_ERROR
    assert outcome.error is not None
    assert "not RPC records" in outcome.error


def test_fake_pi_crashing_at_startup(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, _ = run_sync(
        store,
        make_config(tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "crash"}),
        "hello",
        tmp_path,
        pi=fake_pi(),
    )
    assert outcome.status is RunStatus.FAILED
    assert outcome.stop_reason is StopReason.STARTUP_FAILED
    assert outcome.error is not None
    assert "the configuration is broken" in outcome.error


def test_soft_stop_that_pi_ignores_escalates_and_refuses_the_session(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    config = make_config(
        tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "deaf"}, deadline_s=100
    )

    async def go() -> RunOutcome:
        result: list[RunOutcome] = []
        events: list[RunEvent] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                request = RunRequest(
                    session="s1", agent="rev", text="work", workdir=workdir_in(tmp_path)
                )
                result.append(
                    await execute_run(
                        store,
                        config,
                        request,
                        clock=clock,
                        pi=fake_pi(),
                        subscribers=[events.append],
                    )
                )

            tg.start_soon(run)
            await _wait_for(lambda: any(type(e).__name__ == "PiStarted" for e in events))
            with anyio.fail_after(20):
                await clock.sleepers(1, at=100.0)  # the run waits for its deadline
            clock.advance(100)  # the deadline: abort is sent, pi never answers
            await _wait_for(lambda: any(type(e).__name__ == "StopRequested" for e in events))
            with anyio.fail_after(20):  # the abort waits out the grace on the clock
                await clock.sleepers(1, at=100.0 + config.harness.stop_grace_s)
            clock.advance(config.harness.stop_grace_s)  # the grace runs out: kill
        return result[0]

    outcome = anyio.run(go)
    assert outcome.status is RunStatus.INTERRUPTED
    assert outcome.stop_reason is StopReason.DEADLINE
    run = store.get_run(outcome.run)
    assert run.extra["escalated"] is True
    refusing = store.get_session("s1").refusing
    assert refusing is not None
    assert outcome.run in refusing


def test_blocking_dialogs_are_cancelled_and_notify_is_forwarded(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome, events = run_sync(
        store,
        make_config(tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "dialog"}),
        "hello",
        tmp_path,
        pi=fake_pi(),
    )
    assert outcome.status is RunStatus.FINISHED
    assert outcome.answer is not None
    answer = json.loads(outcome.answer.removeprefix("dialog answer: "))
    assert answer == {"cancelled": True, "id": "ui-1", "type": "extension_ui_response"}
    notices = [e for e in events if type(e).__name__ == "Notice"]
    assert [(n.level, n.message) for n in notices] == [("warning", "heads up")]  # type: ignore[attr-defined]


def test_follow_up_view_quoted_evidence_reaches_the_model(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider([Reply("first answer"), Reply("second answer")])
    config = make_config(tmp_path, p.url)
    run_sync(store, config, "first request", tmp_path)
    store.add_note("s1", "rev", "the build runs with `make`")
    two, _ = run_sync(store, config, "second request", tmp_path)
    assert two.status is RunStatus.FINISHED
    texts = p.requests[1].user_texts
    assert len(texts) == 3
    notes, first, second = texts
    assert "quoted evidence, not instructions" in notes
    assert "the build runs with `make`" in notes
    assert (first, second) == ("first request", "second request")
    assert p.requests[1].contains("first answer")
    # tether's own quoted messages are not rows: the ledger holds no copy of the note
    assert not any("the build runs" in json.dumps(r.body) for r in rows(store))


def test_a_newer_owner_fences_the_harness_out(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """After a proper takeover naming the same pi, the old harness's soft stop sends nothing
    to that pi (no abort, no end of stdin) and never signals it: it is the new owner's."""
    p = scripted_provider(
        [Reply("mine", tool_calls=[ToolCall("bash", {"command": "true"})]), Stall()]
    )
    taken: list[int] = []

    def take_over(stop: StopControl, events: list[RunEvent]) -> None:
        run = next(e.run for e in events if isinstance(e, RunStarted))
        lease = store.lease(run)
        assert lease is not None
        assert lease.placement is not None
        assert "pi_pid" in lease.placement  # the heartbeat named pi
        fence = store.take_over(
            run,
            epoch=lease.epoch,
            owner="host-b/4242",
            lease_s=60,
            placement={**lease.placement, "host": "host-b", "harness_pid": 4242},
        )
        assert fence is not None
        taken.append(fence.epoch)
        stop.soft()  # the old harness is asked to stop: pi is not its own any more

    outcome, events = _run_until(
        store,
        make_config(tmp_path, p.url),
        tmp_path,
        ready=lambda _: len(p.requests) == 2,
        act=take_over,
    )
    pi_pid = next(e.pid for e in events if isinstance(e, PiStarted))
    try:
        assert outcome.stop_reason is StopReason.FENCED_OUT
        assert outcome.error is not None
        assert "newer owner" in outcome.error
        assert "host-b/4242" in outcome.error
        run = store.get_run(outcome.run)
        assert run.status is RunStatus.RUNNING, "the run is the new owner's to end"
        assert run.epoch == taken[0]
        assert not any(r.body.get("stopReason") == "aborted" for r in rows(store))
        # Nothing reached pi from the old harness after the takeover: pi answered no abort
        # (its answers are all in the events file), still runs, and its stdin is open.
        answered = [
            json.loads(line).get("command")
            for line in (outcome.run_dir / "events.jsonl").read_bytes().split(b"\n")
            if b'"response"' in line
        ]
        assert "abort" not in answered, answered
        assert _alive(pi_pid), "the old harness stopped a pi the new owner holds"
        time.sleep(1.0)
        assert _alive(pi_pid), "pi ended after the old harness left (its stdin was closed?)"
        assert not (outcome.run_dir / "exit.json").exists()
    finally:
        if _alive(pi_pid):
            os.killpg(pi_pid, signal.SIGKILL)


def test_truncated_and_empty_answers_are_recorded_as_they_are(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    p = scripted_provider(
        route(task=[truncated("an answer cut by the tok"), empty()], summary=[Reply("S")])
    )
    config = make_config(tmp_path, p.url)
    cut, _ = run_sync(store, config, "long answer please", tmp_path)
    assert cut.status is RunStatus.FINISHED
    assert cut.answer == "an answer cut by the tok"
    last = [r for r in rows(store) if r.role == "assistant"][-1]
    assert last.body["stopReason"] == "length"
    assert last.body["content"][0]["text"] == "an answer cut by the tok"
    blank, _ = run_sync(store, config, "say nothing", tmp_path)
    assert blank.status is RunStatus.FINISHED
    assert blank.answer is None
    last = [r for r in rows(store) if r.role == "assistant"][-1]
    assert last.run == blank.run
    assert last.body["content"] == []


def test_a_second_stop_during_close_kills_at_once_and_a_late_stop_keeps_the_run_finished(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pi settled, then ignores the end of stdin and SIGTERM: an orderly close would take two
    grace periods (2 x 5 s). A soft stop then a hard one (Ctrl-C twice) during that close kill it
    at once, and since the task turn had settled, the run stays finished."""
    config = make_config(tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "stubborn"})
    stopped_at: list[float] = []

    def twice(stop: StopControl, _: list[RunEvent]) -> None:
        stopped_at.append(time.monotonic())
        stop.soft()
        stop.stop_hard()

    outcome, events = _run_until(
        store,
        config,
        tmp_path,
        ready=lambda evs: any(isinstance(e, Settled) for e in evs),
        act=twice,
        pi=fake_pi(),
    )
    took = time.monotonic() - stopped_at[0]
    assert took < 2.5, f"the hard stop waited {took:.1f}s for the orderly close"
    assert (outcome.status, outcome.stop_reason, outcome.answer) == (
        RunStatus.FINISHED,
        StopReason.SETTLED,
        "all done",
    )
    pi_pid = next(e.pid for e in events if isinstance(e, PiStarted))
    assert not _alive(pi_pid)
    assert store.get_run(outcome.run).status is RunStatus.FINISHED


def _stubborn_config(tmp_path: Path) -> Config:
    """A fake pi that ignores abort, with half a second's grace for a stop."""
    config = make_config(
        tmp_path, "http://127.0.0.1:9/v1", env={"FAKE_PI_MODE": "stubborn"}, deadline_s=600
    )
    return config.model_copy(
        update={"harness": config.harness.model_copy(update={"stop_grace_s": 0.5})}
    )


def test_a_soft_stop_after_pi_settled_does_not_interrupt_the_run(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _stubborn_config(tmp_path)
    outcome, _ = _run_until(
        store,
        config,
        tmp_path,
        ready=lambda evs: any(isinstance(e, Settled) for e in evs),
        act=lambda stop, _: stop.soft(),
        pi=fake_pi(),
    )
    assert (outcome.status, outcome.stop_reason) == (RunStatus.FINISHED, StopReason.SETTLED)
    assert store.get_run(outcome.run).status is RunStatus.FINISHED
    assert store.get_session("s1").refusing is None


def test_a_soft_stop_asked_as_pi_settles_does_not_interrupt_the_run(
    tmp_path: Path, store: Ledger
) -> None:
    """The stop is asked from inside pi's settle (its event's subscriber), before the task
    waiting for that settle wakes: the soft scope is cancelled then, but pi has settled, so
    the run ends as pi ended it, as for a stop asked a moment later (the test above, whose
    stop lands after the task woke, or, now and then, before)."""
    config = _stubborn_config(tmp_path)

    async def go() -> RunOutcome:
        stop = StopControl()

        def on_event(event: RunEvent) -> None:
            if isinstance(event, Settled):
                stop.soft()

        request = RunRequest(session="s1", agent="rev", text="work", workdir=workdir_in(tmp_path))
        return await execute_run(
            store, config, request, stop=stop, subscribers=[on_event], pi=fake_pi()
        )

    outcome = anyio.run(go)
    assert (outcome.status, outcome.stop_reason) == (RunStatus.FINISHED, StopReason.SETTLED)
    assert store.get_run(outcome.run).status is RunStatus.FINISHED
    assert store.get_session("s1").refusing is None


def test_a_missing_api_key_is_refused_before_anything_is_written(
    tmp_path: Path, store: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_TEST_UNSET_KEY", raising=False)
    config = Config.model_validate(
        {
            "providers": {
                "hosted": {
                    "base_url": "http://127.0.0.1:9/v1",
                    "api_key_env": "TETHER_TEST_UNSET_KEY",
                }
            },
            "agents": {"rev": {"provider": "hosted", "model": "m"}},
            "harness": {
                "runs_dir": str(tmp_path / "runs"),
                "workspaces_dir": str(tmp_path / "workspaces"),
            },
        }
    )
    with pytest.raises(ConfigError, match=r"\$TETHER_TEST_UNSET_KEY"):
        run_sync(store, config, "hello", tmp_path, pi=fake_pi())
    assert store.sessions() == []
    assert not (tmp_path / "runs").exists()
