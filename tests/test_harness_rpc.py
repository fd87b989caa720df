"""pi's RPC framing and the client, over a scripted in-memory transport; the subprocess
transport's escalation against real processes."""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.pi.client import Closed, Record, RpcClient, Stray
from tether.pi.errors import TransportClosed
from tether.pi.jsonl import LineSplitter, decode, encode
from tether.pi.transport import SubprocessTransport

# -- framing ---------------------------------------------------------------------------------------

json_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


@given(
    records=st.lists(st.dictionaries(st.sampled_from(["a", "b", "type"]), json_text), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10),
)
def test_framing_round_trips_whatever_the_chunking(
    records: list[dict[str, Any]], cuts: list[int]
) -> None:
    data = b"".join(encode(r) for r in records)
    points = sorted({c % (len(data) + 1) for c in cuts})
    splitter = LineSplitter()
    lines: list[bytes] = []
    start = 0
    for point in [*points, len(data)]:
        lines += splitter.feed(data[start:point])
        start = point
    assert splitter.flush() is None
    assert [decode(line) for line in lines] == records


def test_unicode_separators_and_crlf() -> None:
    record = {"type": "x", "text": "one\u2028two\u2029three\x85four\rfive"}
    data = encode(record)
    assert data.count(b"\n") == 1
    splitter = LineSplitter()
    assert [decode(line) for line in splitter.feed(data)] == [record]
    assert splitter.feed(b'{"type":"crlf"}\r\n') == [b'{"type":"crlf"}']
    assert splitter.feed(b'{"unterminated":') == []
    assert splitter.flush() == b'{"unterminated":'
    with pytest.raises(ValueError, match="not an object"):
        decode(b"[1,2]")


# -- the client ----------------------------------------------------------------------------------


class ScriptedTransport:
    """pi's side played by the test: ``emit`` writes a stdout line, ``sent`` holds stdin."""

    def __init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[bytes](math.inf)
        self.sent: list[dict[str, Any]] = []
        self.arrived = anyio.Event()
        self.killed = False

    def emit(self, record: dict[str, Any] | bytes) -> None:
        self._send.send_nowait(record if isinstance(record, bytes) else encode(record)[:-1])

    def end(self) -> None:
        self._send.close()

    async def lines(self) -> AsyncIterator[bytes]:
        async with self._receive:
            async for line in self._receive:
                yield line

    async def send(self, data: bytes) -> None:
        if self.killed:
            raise TransportClosed("closed")
        self.sent.append(json.loads(data))
        self.arrived.set()

    async def aclose(self) -> None:
        self.end()

    async def kill(self) -> None:
        self.killed = True
        self.end()

    @property
    def exit_status(self) -> int | None:
        return None

    def diagnostics(self) -> str:
        return "the last stderr line"

    async def next_command(self) -> dict[str, Any]:
        while not self.sent:
            self.arrived = anyio.Event()
            await self.arrived.wait()
        return self.sent.pop(0)


def _respond(cmd: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"id": cmd["id"], "type": "response", "command": cmd["type"], "success": True, **fields}


async def _drain(receive: Any) -> list[Record]:
    return [item async for item in receive]


def test_responses_are_matched_by_id_out_of_order() -> None:
    async def go() -> None:
        t = ScriptedTransport()
        async with RpcClient.connect(t) as client:
            results: dict[str, Any] = {}

            async def ask(name: str) -> None:
                results[name] = await client.request(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "get_state")
                first = await t.next_command()
                tg.start_soon(ask, "get_messages")
                second = await t.next_command()
                t.emit(_respond(second, data={"messages": []}))
                t.emit({"type": "agent_start"})
                t.emit(_respond(first, data={"isStreaming": False}))
            assert results["get_state"].data == {"isStreaming": False}
            assert results["get_messages"].data == {"messages": []}
            assert first["type"] == "get_state"
            assert first["id"] != second["id"]

    anyio.run(go)


def test_idless_parse_error_settles_the_only_pending_request_and_is_reported() -> None:
    async def go() -> None:
        t = ScriptedTransport()
        async with RpcClient.connect(t) as client:
            events = client.subscribe()
            async with anyio.create_task_group() as tg:
                got: list[Any] = []

                async def ask() -> None:
                    got.append(await client.request("get_state"))

                tg.start_soon(ask)
                await t.next_command()
                t.emit({"type": "response", "command": "parse", "success": False, "error": "bad"})
            assert got[0].success is False
            assert got[0].id is None
            assert got[0].error == "bad"
            t.end()
            items = await _drain(events)
        assert items[0] == {
            "type": "response",
            "command": "parse",
            "success": False,
            "error": "bad",
        }
        assert isinstance(items[-1], Closed)

    anyio.run(go)


def test_stray_lines_are_reported_in_order_with_events() -> None:
    async def go() -> list[Record]:
        t = ScriptedTransport()
        async with RpcClient.connect(t) as client:
            events = client.subscribe()
            t.emit({"type": "agent_start"})
            t.emit(b"Debugger attached.")
            t.emit(b"[1]")
            t.emit({"type": "agent_settled", "aborted": False})
            t.end()
            items = await _drain(events)
            assert client.strays == 2
        return items

    items = anyio.run(go)
    assert items[0] == {"type": "agent_start"}
    assert isinstance(items[1], Stray)
    assert items[1].line == b"Debugger attached."
    assert isinstance(items[2], Stray)
    assert "not an object" in items[2].problem
    assert items[3] == {"type": "agent_settled", "aborted": False}
    assert isinstance(items[4], Closed)


def test_a_listener_sees_every_record_first_in_order_until_its_block_ends() -> None:
    """``listening``: the reader calls the listener with each record before a subscriber's
    stream has it, strays included; after the block, nothing more; a listener that raises
    ends the client as a failed read would, naming what it raised."""

    async def go() -> None:
        t = ScriptedTransport()
        seen: list[Record] = []
        queued_before: list[int] = []
        three = anyio.Event()
        async with RpcClient.connect(t) as client:
            events = client.subscribe()

            def listener(item: Record) -> None:
                queued_before.append(events.statistics().current_buffer_used)
                seen.append(item)
                if len(seen) == 3:
                    three.set()

            async with client.listening(listener):
                t.emit({"type": "agent_start"})
                t.emit(b"Debugger attached.")
                t.emit({"type": "agent_settled", "aborted": False})
                with anyio.fail_after(5):
                    await three.wait()
            t.emit({"type": "turn_start"})  # after the block: not the listener's
            t.end()
            items = await _drain(events)
        assert seen[0] == {"type": "agent_start"}
        assert isinstance(seen[1], Stray)
        assert seen[2] == {"type": "agent_settled", "aborted": False}
        assert len(seen) == 3, "the listener saw records after its block"
        # Each record reached the listener before the subscriber's stream held it.
        assert queued_before == [0, 1, 2]
        assert [i.get("type") for i in items if isinstance(i, dict)] == [
            "agent_start",
            "agent_settled",
            "turn_start",
        ]
        assert isinstance(items[-1], Closed)

    anyio.run(go)

    async def failing_listener() -> str:
        t = ScriptedTransport()
        async with RpcClient.connect(t) as client:

            def failing(item: Record) -> None:
                raise RuntimeError("listener broke")

            async with client.listening(failing):
                t.emit({"type": "agent_start"})
                with anyio.fail_after(5):
                    await client.closed.wait()
            assert client.closed_reason is not None
            return client.closed_reason

    reason = anyio.run(failing_listener)
    assert "reading pi's output failed: listener broke" in reason


def test_pending_requests_fail_when_the_transport_closes() -> None:
    async def go() -> None:
        t = ScriptedTransport()
        async with RpcClient.connect(t) as client:
            errors: list[Exception] = []

            async def ask() -> None:
                try:
                    await client.request("prompt", message="hi")
                except TransportClosed as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await t.next_command()
                t.end()
            assert len(errors) == 1
            assert "the last stderr line" in str(errors[0])
            assert client.closed.is_set()
            with pytest.raises(TransportClosed):
                await client.request("get_state")
            late = client.subscribe()
            assert isinstance(await late.receive(), Closed)

    anyio.run(go)


def test_dialogs_are_cancelled_and_every_ui_request_is_forwarded() -> None:
    async def go() -> None:
        t = ScriptedTransport()
        async with RpcClient.connect(t) as client:
            events = client.subscribe()
            for method in ("select", "confirm", "input", "editor"):
                t.emit({"type": "extension_ui_request", "id": f"ui-{method}", "method": method})
            t.emit({"type": "extension_ui_request", "id": "n1", "method": "notify", "message": "m"})
            answers = [await t.next_command() for _ in range(4)]
            t.end()
            forwarded = [i for i in await _drain(events) if isinstance(i, dict)]
        assert sorted(a["id"] for a in answers) == [
            "ui-confirm",
            "ui-editor",
            "ui-input",
            "ui-select",
        ]
        assert all(
            a == {"type": "extension_ui_response", "id": a["id"], "cancelled": True}
            for a in answers
        )
        assert [f["method"] for f in forwarded] == [
            "select",
            "confirm",
            "input",
            "editor",
            "notify",
        ]

    anyio.run(go)


# -- the subprocess transport ---------------------------------------------------------------------


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()          # ignores EOF: keeps running after stdin closes
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_close_escalates_to_sigkill_reaps_and_kills_detached_children(tmp_path: Path) -> None:
    async def go() -> tuple[int, int, float, int | None]:
        log = tmp_path / "stderr.log"
        async with SubprocessTransport.open(
            [sys.executable, "-c", STUBBORN],
            env=dict(os.environ),
            cwd=tmp_path,
            stderr_log=log,
            grace_s=0.3,
        ) as t:
            lines = t.lines()
            child = int(await lines.__anext__())
            pid = t.pid
            started = time.monotonic()
            await t.aclose()
            took = time.monotonic() - started
            return pid, child, took, t.exit_status

    pid, child, took, status = anyio.run(go)
    assert status == -9
    assert took > 0.5, "closed stdin, waited, SIGTERM ignored, waited, SIGKILL"
    assert not _alive(pid)
    # SIGKILL is delivered asynchronously: the detached child dies a moment after kill() returns.
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(child), "a tool shell in its own process group is killed too"


def test_orderly_exit_keeps_stderr_in_the_log(tmp_path: Path) -> None:
    script = "import sys; sys.stderr.write('diagnostic one\\ndiagnostic two\\n'); sys.stdin.read()"

    async def go() -> tuple[str, int | None]:
        async with SubprocessTransport.open(
            [sys.executable, "-c", script],
            env=dict(os.environ),
            cwd=tmp_path,
            stderr_log=tmp_path / "e.log",
            grace_s=5,
        ) as t:
            await t.aclose()
            return t.diagnostics(), t.exit_status

    tail, status = anyio.run(go)
    assert status == 0
    assert tail == "diagnostic one\ndiagnostic two"
    assert (tmp_path / "e.log").read_text() == "diagnostic one\ndiagnostic two\n"


def test_a_stray_child_holding_pis_pipes_leaves_no_descriptor_open_after_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pi exits; a child it started (here in pi's own process group, so the close does not kill
    # it) still holds pi's stdout and stderr. The close reaps pi and must close the pipes itself:
    # left to the garbage collector, they outlived the event loop and raised in __del__.
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))

    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    async def go() -> int | None:
        async with SubprocessTransport.open(
            ["sh", "-c", "sleep 5 & exit 0"],
            env={"PATH": os.environ["PATH"]},
            cwd=tmp_path,
            stderr_log=tmp_path / "e.log",
            grace_s=0.3,
        ) as t:
            await t.aclose()
            return t.exit_status

    before = open_fds()
    assert anyio.run(go) == 0
    assert open_fds() <= before
    gc.collect()
    assert unraisable == []
