"""Ledger benchmark: append throughput against raw ``sqlite3.executemany``, and bounded reads on
short and long sessions. Every figure is a ratio against a baseline measured in the same run.

    .venv/bin/python bench/ledger.py            # 10^3, 10^5, 10^6 rows (a few minutes)
    .venv/bin/python bench/ledger.py --quick    # 10^3, 10^4, 10^5 rows
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger
from tether.ledger.sql import _INSERT_ROW, encode_row
from tether.ledger.sqlite import MIGRATIONS


def message(i: int) -> dict[str, Any]:
    if i % 3 == 0:
        return {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"step {i}: reading the next file"},
                {
                    "type": "toolCall",
                    "id": f"c{i}",
                    "name": "read",
                    "arguments": {"path": f"src/m{i}.py"},
                },
            ],
            "stopReason": "toolUse",
            "usage": {"input": 1200, "output": 40, "totalTokens": 1240},
        }
    if i % 3 == 1:
        return {
            "role": "toolResult",
            "toolCallId": f"c{i - 1}",
            "toolName": "read",
            "content": [{"type": "text", "text": f"def f{i}(x):\n    return x * {i}\n" * 12}],
            "isError": False,
        }
    return {"role": "user", "content": [{"type": "text", "text": f"follow-up {i}"}]}


def actor(i: int) -> str:
    return ("agent:reviewer", "tool:read", "user:ana")[i % 3]


def fill(ledger: Ledger, session: str, n: int, batch: int = 1000) -> None:
    """A session of n rows over runs of 1,000 rows, with a compaction near the start and notes."""
    ledger.create_session(session)
    ledger.add_note(session, "reviewer", "prefers diffs")
    i = 0
    while i < n:
        run = ledger.create_run(session, "reviewer")
        fence = ledger.claim_run(run.id)
        ledger.append(fence, [NewRow.message("user:ana", message(2))], request=True)
        i += 1
        if i == 2:
            body = {"summary": "early summary", "covers_to": 1, "continuation": {"version": 1}}
            ledger.append(fence, [NewRow("agent:reviewer", RowKind.COMPACTION, body)])
            i += 1
        stop = min(n, i + batch - 1)
        ledger.append(fence, [NewRow.message(actor(j), message(j)) for j in range(i, stop)])
        i = stop
        ledger.end_run(fence, RunStatus.FINISHED)


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of one call."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def bench_append(tmp: Path, rows: int, batch: int) -> None:
    news = [NewRow.message(actor(i), message(i)) for i in range(rows)]

    # Baseline 1, the headline: what a plain log does with the same rows, json.dumps and
    # executemany into (session, seq, actor, body) with its unique key, a transaction a batch.
    raw = sqlite3.connect(tmp / "raw.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("PRAGMA synchronous = NORMAL")
    raw.execute(
        "CREATE TABLE log (session TEXT, seq INTEGER, actor TEXT, body TEXT, UNIQUE (session, seq))"
    )
    t0 = time.perf_counter()
    for k in range(0, rows, batch):
        raw.execute("BEGIN IMMEDIATE")
        raw.executemany(
            "INSERT INTO log VALUES (?, ?, ?, ?)",
            [
                ("s", k + i + 1, r.actor, json.dumps(r.body))
                for i, r in enumerate(news[k : k + batch])
            ],
        )
        raw.execute("COMMIT")
    plain = time.perf_counter() - t0
    raw.close()

    # Baseline 2, the harshest: tether's own encoded tuples, prepared outside the clock, into
    # tether's schema. What is left is the fence, the seq counter and the encoding itself.
    raw = sqlite3.connect(tmp / "raw2.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("PRAGMA synchronous = NORMAL")
    raw.executescript(MIGRATIONS[0])
    raw.execute("INSERT INTO sessions (id, created) VALUES ('s', 't')")
    raw.execute("INSERT INTO runs (id, session, agent, status) VALUES ('r', 's', 'a', 'running')")
    encoded = [encode_row("s", i + 1, "r", row) for i, row in enumerate(news)]
    t0 = time.perf_counter()
    for k in range(0, rows, batch):
        raw.execute("BEGIN IMMEDIATE")
        raw.executemany(_INSERT_ROW, encoded[k : k + batch])
        raw.execute("COMMIT")
    pre = time.perf_counter() - t0
    raw.close()

    with open_ledger(f"sqlite://{tmp}/ledger.db") as ledger:
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        t0 = time.perf_counter()
        for k in range(0, rows, batch):
            ledger.append(fence, news[k : k + batch])
        ours = time.perf_counter() - t0

    print(f"append {rows:,} rows in batches of {batch} (a transaction a batch):")
    print(f"  raw: json.dumps + executemany           {rows / plain:>10,.0f} rows/s")
    print(f"  raw: pre-encoded tuples, tether schema  {rows / pre:>10,.0f} rows/s")
    print(f"  tether append (fenced, seq, measured)   {rows / ours:>10,.0f} rows/s")
    print(f"  ratio tether : raw json.dumps           {plain / ours:>10.2f}   (target >= 0.5)")
    print(f"  ratio tether : raw pre-encoded          {pre / ours:>10.2f}")


READS: dict[str, Callable[[Ledger, str, int], object]] = {
    "latest_compaction": lambda lg, s, n: lg.latest_compaction(s),
    "last_ended_run": lambda lg, s, n: lg.last_ended_run(s, "reviewer"),
    "row (exact seq)": lambda lg, s, n: lg.row(s, n // 2),
    "tail (240,000 bytes)": lambda lg, s, n: lg.tail(s, 240_000),
    "rows_range (cap 100)": lambda lg, s, n: lg.rows_range(s, n // 2, n, limit=100),
    "notes (bounded)": lambda lg, s, n: lg.notes(s, "reviewer"),
}


def bench_reads(tmp: Path, sizes: list[int], repeat: int) -> None:
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        t0 = time.perf_counter()
        with open_ledger(f"sqlite://{tmp}/reads-{n}.db") as ledger:
            fill(ledger, "s", n)
            built = time.perf_counter() - t0
            print(f"built a session of {n:,} rows in {built:.1f} s", flush=True)
            results[n] = {
                name: timed(functools.partial(f, ledger, "s", n), repeat)
                for name, f in READS.items()
            }
    small, large = sizes[0], sizes[-1]
    head = "".join(f"{n:>12,}" for n in sizes)
    print(f"\nbounded reads, median µs over {repeat} calls, by session length:")
    print(f"  {'read':<24}{head}   ratio {large:,} : {small:,} (target <= 2)")
    for name in READS:
        cells = "".join(f"{results[n][name] * 1e6:>12.1f}" for n in sizes)
        print(f"  {name:<24}{cells}   {results[large][name] / results[small][name]:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="sessions of 10^3, 10^4, 10^5 rows")
    parser.add_argument("--append-rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    sizes = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**5, 10**6]
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as d:
        bench_append(Path(d), args.append_rows, args.batch)
        bench_reads(Path(d), sizes, args.repeat)


if __name__ == "__main__":
    main()
