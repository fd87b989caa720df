"""``tether.threads.in_thread``: the hand-off of blocking calls (the ledger's) to worker threads.

What its callers rely on: the result or the exception comes back, the call sees the caller's
context variables, calls run side by side (a slow one does not hold up the rest), a cancelled
caller waits for its call to end and is cancelled after it, a caller cancelled before the call
does not start it, and a forked child can hand off too.
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time

import anyio
import pytest

from tether import threads
from tether.threads import in_thread

TRACE: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="none")


def _workers() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "tether-worker")


def test_result_exception_and_context_come_back() -> None:
    def boom() -> None:
        raise KeyError("missing row")

    async def main() -> tuple[int, str, str]:
        TRACE.set("run-7")
        total = await in_thread(sum, [1, 2, 3])
        seen = await in_thread(TRACE.get)
        name = await in_thread(lambda: threading.current_thread().name)
        with pytest.raises(KeyError, match="missing row"):
            await in_thread(boom)
        return total, seen, name

    assert anyio.run(main) == (6, "run-7", "tether-worker")


def test_calls_run_side_by_side_and_threads_are_reused() -> None:
    # Eight calls that each wait for all eight: they finish only if eight threads run at once.
    barrier = threading.Barrier(8, timeout=10)

    async def wave() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(in_thread, barrier.wait)

    anyio.run(wave)
    after_first = _workers()
    assert after_first >= 8
    barrier.reset()
    anyio.run(wave)  # a second wave on a new event loop takes the idle threads
    assert _workers() == after_first


def test_calls_beyond_the_limit_wait_their_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_pool", threads._Pool())
    monkeypatch.setattr(threads, "MAX_THREADS", 2)
    running = 0
    most = 0
    lock = threading.Lock()

    def slow(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return i

    results: list[int] = []

    async def main() -> None:
        async def one(i: int) -> None:
            results.append(await in_thread(slow, i))

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i)

    anyio.run(main)
    assert sorted(results) == list(range(6))
    assert most == 2
    assert threads._pool._threads == 2


def test_a_cancelled_caller_waits_for_its_call_then_is_cancelled() -> None:
    done = threading.Event()
    reached_after = False

    def write() -> str:
        time.sleep(0.3)
        done.set()
        return "written"

    async def main() -> tuple[bool, bool, float]:
        nonlocal reached_after
        started = time.monotonic()
        with anyio.move_on_after(0.05) as scope:
            await in_thread(write)
            reached_after = True  # the call's result comes back into the cancelled scope
            await anyio.sleep(1)  # the next checkpoint: cancelled here
            pytest.fail("the cancelled scope went on past a checkpoint")
        return scope.cancelled_caught, done.is_set(), time.monotonic() - started

    caught, finished, took = anyio.run(main)
    assert caught
    assert finished, "the caller left before its call ended"
    assert reached_after
    assert 0.3 <= took < 1


def test_a_caller_cancelled_before_the_call_does_not_start_it() -> None:
    started: list[str] = []

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await in_thread(started.append, "call")
        return scope.cancelled_caught

    assert anyio.run(main)
    assert started == []


def test_a_forked_child_hands_off_to_threads_of_its_own() -> None:
    anyio.run(in_thread, time.sleep, 0)  # the parent has worker threads before the fork
    pid = os.fork()
    if pid == 0:  # the child: none of the parent's threads exist here
        signal.alarm(10)  # a child whose call is never taken ends here
        ok = False
        try:
            ok = anyio.run(in_thread, sum, [2, 3]) == 5
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
