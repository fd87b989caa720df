"""Blocking calls from async code: the ledger API is synchronous, the harness and the service
are not.

    rows = await in_thread(ledger.append, fence, rows, request=True)

The hand-off is tether's own, not ``anyio.to_thread.run_sync``: a run makes about 60 of them
(the mirror's appends, heartbeats, its start and end), and anyio's costs 257k instructions a
call against 108k for this one (``valgrind --tool=callgrind``, 1,000 calls of a no-op; anyio's
goes through a capacity limiter, a worker registry and a ``queue.Queue`` per worker). asyncio's
``run_in_executor`` (194k) is not used either: a ``ThreadPoolExecutor`` joins its threads at the
interpreter's exit, so one call stuck on a lock would hold up the process's end, and in a
forked child a call waits for its parent's idle threads, which are not there. What it keeps:
the call runs in the caller's context (context variables: a run's trace), an exception is
raised in the caller, and a cancelled caller waits for the call to end (a ledger write is never
abandoned halfway). It needs anyio's asyncio backend, the only one tether runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

__all__ = ["MAX_THREADS", "in_thread"]

T = TypeVar("T")

MAX_THREADS = 40
"""Worker threads at most (anyio's default too); calls beyond wait their turn in the queue."""

_Job = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], contextvars.Context, Callable[[], Any]]


class _Pool:
    """Worker threads fed by one queue: a thread is started only when none is idle."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # that thread takes this job (or an earlier one)
            elif self._threads < MAX_THREADS:
                self._threads += 1
                threading.Thread(target=self._work, name="tether-worker", daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            loop, future, context, fn = self._jobs.get()
            try:
                result, error = context.run(fn), None
            except BaseException as exc:  # raised in the caller
                result, error = None, exc
            del fn, context  # hold nothing while idle
            # Idle before the caller hears back, so that its next call takes this thread.
            with self._lock:
                self._idle += 1
            # A closed loop (RuntimeError) has nobody waiting for this result.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)
            del loop, future, result, error


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


_pool = _Pool()


def _after_fork() -> None:
    # A forked child has none of its parent's threads.
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_after_fork)


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, awaited (cancellation waits for it)."""
    # A caller already cancelled is cancelled here, before the call starts (as with anyio's).
    await anyio.lowlevel.checkpoint_if_cancelled()
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
    _pool.submit((loop, future, contextvars.copy_context(), call))
    # Shielded: cancelling the caller must not cancel the future and leave the call running
    # unawaited; the scope's cancellation reaches the caller at its next checkpoint.
    with anyio.CancelScope(shield=True):
        result = await future
    return result
