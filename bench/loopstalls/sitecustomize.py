"""``bench/service.py --loop-stalls MS``: a serve process's event-loop callbacks that took long.

This directory is put on the serve process's ``PYTHONPATH`` (only there: the keeper and the
forwarder run under ``python -I -S``, which reads neither), so Python's ``site`` imports this
module at start. With ``TETHER_BENCH_LOOP_STALLS=MS:FILE`` set, every asyncio callback that takes
longer than MS of wall time is written to FILE as one line: the time it ended, its wall time and
its thread's CPU time (ms), and, for a task's step, the coroutine chain it stopped at (the await
that ended the step: its outermost two frames and innermost three). A step whose CPU is a small
part of its wall time waited for a CPU or for the GIL: it did not work that long. Each garbage
collection over MS is written too (``gc: generation N``): it runs inside whatever step allocated.
"""

from __future__ import annotations

import os


def _where(handle: object) -> str:
    task = getattr(getattr(handle, "_callback", None), "__self__", None)
    if task is None or not hasattr(task, "get_coro"):
        return repr(handle)[:160]
    names = []
    coro = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is not None:
            names.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if len(names) > 5:
        names = [*names[:2], "…", *names[-3:]]
    return " > ".join(names) or "(the task ended)"


def _install(spec: str) -> None:
    import asyncio.events
    import time

    limit_ms, _, path = spec.partition(":")
    limit = float(limit_ms) / 1000
    out = open(path, "a", buffering=1)  # noqa: SIM115  (open for the process's life)
    run = asyncio.events.Handle._run

    def timed(self: asyncio.events.Handle) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        run(self)
        took = time.perf_counter() - wall
        if took > limit:
            used = time.thread_time() - cpu
            out.write(f"{time.time():.4f}\t{took * 1000:.2f}\t{used * 1000:.2f}\t{_where(self)}\n")

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]

    import gc

    started = [0.0, 0.0]

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
            return
        took = time.perf_counter() - started[0]
        if took > limit:
            used = time.thread_time() - started[1]
            what = f"gc: generation {info['generation']}, {info['collected']} collected"
            out.write(f"{time.time():.4f}\t{took * 1000:.2f}\t{used * 1000:.2f}\t{what}\n")

    gc.callbacks.append(collected)


if _spec := os.environ.get("TETHER_BENCH_LOOP_STALLS"):
    _install(_spec)
