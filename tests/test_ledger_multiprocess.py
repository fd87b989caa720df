"""Fencing and dense seqs across processes (invariant 17): 8 processes append to 8 sessions while
pairs race to own the same runs, taking them over from each other mid-run.

Each worker records what the ledger acknowledged and when (``time.monotonic`` is one clock for
every process on the machine). Afterwards the ledger must hold exactly the acknowledged rows,
every session's seqs must be dense, and no write may have been accepted under an epoch that a
completed claim had already superseded, or into a run that had already ended.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from pg import fresh_schema_url
from tether.errors import FencedOut, RunNotActive
from tether.ledger import NewRow, RunStatus, open_ledger

WORKERS = 8
SESSIONS = 8
RUNS_PER_PAIR = 12
BATCHES = 10  # per claim
PER_BATCH = 3  # rows per append
CLAIMS_PER_RUN = 4  # per worker, before it moves on


def race(worker: int, url: str, runs: list[str], barrier: Barrier, out: str) -> None:
    """One process: claim each run of its pair, write batches under the fence, end the run;
    when fenced out, take the run back half of the time."""
    rng = random.Random(worker)
    ledger = open_ledger(url)
    acks: list[list[Any]] = []
    claims: list[list[Any]] = []
    ends: list[list[Any]] = []
    refused = Counter[str]()
    n = 0
    barrier.wait(120)
    for run_id in runs:
        for _ in range(CLAIMS_PER_RUN):
            try:
                fence = ledger.claim_run(run_id)
            except RunNotActive:
                break
            claims.append([run_id, fence.epoch, worker, time.monotonic()])
            try:
                for _batch in range(BATCHES):
                    rows = []
                    for _ in range(PER_BATCH):
                        n += 1
                        body = {
                            "role": "assistant",
                            "content": [{"type": "text", "text": f"w{worker} n{n}"}],
                            "w": worker,
                            "epoch": fence.epoch,
                        }
                        rows.append(
                            NewRow.message(f"agent:w{worker}", body, entry_id=f"w{worker}-{n}")
                        )
                    began = time.monotonic()
                    for row in ledger.append(fence, rows):
                        acks.append(
                            [row.session, row.seq, run_id, fence.epoch, row.entry_id, began]
                        )
                    time.sleep(rng.random() * 0.002)
                ledger.end_run(fence, RunStatus.FINISHED)
                ends.append([run_id, fence.epoch, time.monotonic()])
                break
            except FencedOut:
                refused["fenced"] += 1
                if rng.random() < 0.5:
                    break
            except RunNotActive:
                refused["inactive"] += 1
                break
    ledger.close()
    Path(out).write_text(
        json.dumps({"acks": acks, "claims": claims, "ends": ends, "refused": refused})
    )


@pytest.fixture(params=["postgres", "sqlite"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path}/ledger.db"
        return
    with fresh_schema_url() as url:
        yield url


@pytest.mark.slow  # 8 spawned processes: too long for make test-fast; make test runs it
def test_fencing_and_dense_seqs_across_processes(shared_url: str, tmp_path: Path) -> None:
    with open_ledger(shared_url) as ledger:
        for s in range(SESSIONS):
            ledger.create_session(f"s{s}")
        pair_runs: list[list[str]] = []
        for pair in range(WORKERS // 2):
            # A pair's runs are spread over every session, so each session takes appends from
            # every pair at once.
            ids = [f"p{pair}-r{k}" for k in range(RUNS_PER_PAIR)]
            for k, rid in enumerate(ids):
                ledger.create_run(f"s{(2 * pair + k) % SESSIONS}", "agent", run_id=rid)
            pair_runs.append(ids)

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [
        ctx.Process(
            target=race,
            args=(w, shared_url, pair_runs[w // 2], barrier, str(tmp_path / f"w{w}.json")),
        )
        for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0] * WORKERS

    results = [json.loads((tmp_path / f"w{w}.json").read_text()) for w in range(WORKERS)]
    acks = [a for r in results for a in r["acks"]]
    claims = [c for r in results for c in r["claims"]]
    ends = [e for r in results for e in r["ends"]]
    fenced = sum(r["refused"].get("fenced", 0) for r in results)

    # The race happened: owners were taken over mid-run and stale writers were turned away.
    assert fenced >= 8, fenced
    assert sum(1 for c in claims if c[1] >= 2) >= 8
    assert max(c[1] for c in claims) >= 3

    claimer = {(c[0], c[1]): c[2] for c in claims}
    assert len(claimer) == len(claims), "two claims got the same epoch"

    with open_ledger(shared_url) as ledger:
        stored = {}
        for s in range(SESSIONS):
            sid = f"s{s}"
            last = ledger.last_seq(sid)
            rows = ledger.rows_range(sid, 1, last, limit=last + 1)
            # Dense: 1..last, one row each.
            assert [r.seq for r in rows] == list(range(1, last + 1))
            assert len({r.body["w"] for r in rows}) >= 4, "each session is written by many"
            stored.update({(r.session, r.seq): r for r in rows})
        final_epoch = {r.id: r.epoch for s in range(SESSIONS) for r in ledger.runs(f"s{s}")}

    # Exactly the acknowledged rows: none lost, none duplicated, none from a refused write.
    ids = Counter(r.entry_id for r in stored.values())
    assert ids.most_common(1)[0][1] == 1
    assert set(ids) == {a[4] for a in acks}
    assert len(stored) == len(acks)
    for session, seq, run, epoch, entry, _ in acks:
        row = stored[(session, seq)]
        assert (row.run, row.entry_id, row.body["epoch"]) == (run, entry, epoch)
        # Written by the owner of that epoch, never above the run's last epoch.
        assert row.body["w"] == claimer[(run, epoch)]
        assert epoch <= final_epoch[run]

    # No stale write: once a claim of epoch e had committed, no write under an older epoch
    # that began afterwards was accepted; nor any write begun after the run had ended.
    superseded = {}
    for run, epoch, _, done in claims:
        for older in range(1, epoch):
            superseded[(run, older)] = min(done, superseded.get((run, older), done))
    ended_at = {run: done for run, _, done in ends}
    for _, _, run, epoch, _, began in acks:
        assert began < superseded.get((run, epoch), float("inf"))
        assert began < ended_at.get(run, float("inf"))

    # Within a run, epochs only grow along the seq order: a stale write would sit after a
    # newer owner's rows.
    by_run: dict[str, list[tuple[str, int, int]]] = {}
    for row in stored.values():
        by_run.setdefault(row.run or "", []).append((row.session, row.seq, row.body["epoch"]))
    for run, seen in by_run.items():
        epochs = [e for _, _, e in sorted(seen)]
        assert epochs == sorted(epochs), run


def first_open(url: str, barrier: Barrier) -> None:
    barrier.wait(120)
    with open_ledger(url) as ledger:
        ledger.ensure_session("s")


@pytest.mark.slow  # 8 spawned processes: too long for make test-fast; make test runs it
def test_processes_opening_a_new_ledger_at_once_migrate_it_once(shared_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=first_open, args=(shared_url, barrier)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    with open_ledger(shared_url) as ledger:
        assert [s.id for s in ledger.sessions()] == ["s"]


def test_a_ledger_created_while_another_opener_looks_is_not_taken_for_a_foreign_one(
    tmp_path: Path,
) -> None:
    # The interleaving the test above can hit by chance, made to happen: an opener reads the
    # new file's schema version (0, nothing yet), another creates the whole ledger and commits,
    # then the first lists the tables. Read apart, the two would describe a database with
    # tables and no version, which is refused as foreign.
    import sqlite3

    from tether.ledger.sqlite import _check_not_foreign

    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as first:
        first.execute("PRAGMA journal_mode = WAL")  # as the first opener leaves a new file
    looker = sqlite3.connect(path, isolation_level=None)
    created: list[str] = []

    def create_meanwhile(statement: str) -> None:
        if "sqlite_master" in statement and not created:
            with open_ledger(f"sqlite:{path}") as other:
                created.append(other.ensure_session("s").id)

    looker.set_trace_callback(create_meanwhile)
    try:
        _check_not_foreign(looker, str(path))
    finally:
        looker.close()
    assert created == ["s"], "the ledger was created between the two reads"
    with open_ledger(f"sqlite:{path}") as ledger:
        assert [s.id for s in ledger.sessions()] == ["s"]
