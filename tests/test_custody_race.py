"""Custody across processes on PostgreSQL (docs/architecture.md#custody): 6 processes enqueue runs
on 3 sessions
and claim them as workers would, holding each for a moment; every claim and end is recorded with
``time.monotonic`` (one clock for the machine). No two runs of a session may ever be live at
once, and each session's runs start in the order they were queued."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

from pg import fresh_schema_url
from tether.ledger import RunStatus, open_ledger

WORKERS = 6
SESSIONS = 3
RUNS_PER_WORKER = 8


def worker(n: int, url: str, barrier: Barrier, out: str) -> None:
    ledger = open_ledger(url)
    spans: list[list[object]] = []
    barrier.wait(120)
    for i in range(RUNS_PER_WORKER):
        ledger.enqueue_run(f"s{(n + i) % SESSIONS}", "rev", actor=f"u:{n}", text=f"{n}.{i}")
    idle = 0
    while idle < 20:
        fence = ledger.claim_next(owner=f"w{n}", lease_s=30)
        if fence is None:
            idle += 1
            time.sleep(0.02)
            continue
        idle = 0
        began = time.monotonic()
        time.sleep(0.005)
        ledger.heartbeat(fence, lease_s=30, placement={"host": f"h{n}"})
        ended = time.monotonic()
        ledger.end_run(fence, RunStatus.FINISHED)
        spans.append([fence.session, fence.run, began, ended])
    ledger.close()
    Path(out).write_text(json.dumps(spans))


def test_many_processes_never_hold_two_live_runs_of_a_session(tmp_path: Path) -> None:
    with fresh_schema_url() as url:
        race(url, tmp_path)


def race(url: str, tmp_path: Path) -> None:
    open_ledger(url).close()  # migrate once, before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    outs = [str(tmp_path / f"w{n}.json") for n in range(WORKERS)]
    procs = [ctx.Process(target=worker, args=(n, url, barrier, outs[n])) for n in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    spans = [s for out in outs for s in json.loads(Path(out).read_text())]
    assert len(spans) == WORKERS * RUNS_PER_WORKER
    ledger = open_ledger(url)
    try:
        for sid in (f"s{k}" for k in range(SESSIONS)):
            mine = sorted((s for s in spans if s[0] == sid), key=lambda s: s[2])
            for before, after in itertools.pairwise(mine):
                assert before[3] <= after[2], f"{sid}: {before[1]} and {after[1]} overlapped"
            # FIFO: the order they started is the order they were queued.
            order = [r.id for r in ledger.runs(sid)]
            assert [s[1] for s in mine] == order
            assert all(r.status is RunStatus.FINISHED for r in ledger.runs(sid))
    finally:
        ledger.close()
