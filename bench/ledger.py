"""Ledger benchmark: append throughput against raw ``sqlite3.executemany``, and bounded reads on
short and long sessions; then the same on PostgreSQL side by side (append with 1, 4 and 8
writer processes against raw psycopg ``executemany``, bounded reads at 10^3 and 10^6 rows).
Every figure is a ratio against a baseline measured in the same run.

    .venv/bin/python bench/ledger.py            # 10^3, 10^5, 10^6 rows (a few minutes)
    .venv/bin/python bench/ledger.py --quick    # 10^3, 10^4, 10^5 rows
    --postgres URL (default $TETHER_TEST_POSTGRES_URL) names the server; the bench works in a
    schema of its own and drops it afterwards. --no-postgres skips that half.
    --against PATH also times the appends of another checkout's ledger (PATH or PATH/src, e.g.
    `git worktree add /tmp/base main`), in a subprocess importing tether from there, each
    measurement beside this tree's (also in a subprocess), and prints the ratios.
    --no-reads skips the bounded reads (appends only).
    --breakdown also splits a SQLite append's time per row into encoding, the insert into the
    schema (and the full-text index's part of it) and the rest, for each tree.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import queue
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger
from tether.ledger.codec import INSERT_ROW, encode_row
from tether.ledger.postgres import _dialect
from tether.ledger.sqlite import MIGRATIONS, SQLiteLedger

# The "raw" baseline: the fields of the interchange row record
# (docs/contracts.md#the-interchange-format), serialized with
# json.dumps and inserted with executemany under the same unique key. No fence, no seq counter,
# no measurement, no search text.
RAW_TABLE = (
    "CREATE TABLE log (session TEXT, seq BIGINT, run TEXT, actor TEXT, kind TEXT, "
    "sources TEXT, body TEXT, UNIQUE (session, seq))"
)


def raw_tuple(session: str, seq: int, row: NewRow) -> tuple[object, ...]:
    return (
        session,
        seq,
        "r",
        row.actor,
        row.kind.value,
        json.dumps(row.sources),
        json.dumps(row.body),
    )


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
        if i == 1:  # the second row: a compaction covering the first
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


def _sqlite_append(path: Path, rows: int, batch: int) -> tuple[float, float]:
    """Seconds (wall, and this process's CPU) for tether to append ``rows`` rows to a new SQLite
    ledger, a batch at a time."""
    news = [NewRow.message(actor(i), message(i)) for i in range(rows)]
    with open_ledger(f"sqlite://{path}") as ledger:
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(0, rows, batch):
            ledger.append(fence, news[k : k + batch])
        return time.perf_counter() - t0, time.process_time() - c0


def _sqlite_breakdown(tmp: Path, rows: int, batch: int) -> tuple[float, ...]:
    """Where an append's time goes, µs per row (each part the median of 3 timings): the whole
    append; encoding (canonical JSON, sizes, search text: ``encode_row``); inserting the encoded
    rows into tether's schema the way the ledger does (``_insert_rows``, a transaction a batch);
    the same with empty search text, whose difference is the full-text index's part. What is
    left of the whole is the ledger's own work around them (fence, seq, queries, rows returned).
    Only what both trees have is used, so ``--against`` times the same parts in each."""
    news = [NewRow.message(actor(i), message(i)) for i in range(rows)]

    def append(k: int) -> float:
        return _sqlite_append(tmp / f"whole-{k}.db", rows, batch)[0]

    def encode(k: int) -> float:
        t0 = time.perf_counter()
        for i, row in enumerate(news):
            encode_row("s", i + 1, "r", row)
        return time.perf_counter() - t0

    def insert(k: int, text: bool) -> float:
        with open_ledger(f"sqlite://{tmp}/insert-{k}-{text}.db") as floor:
            assert isinstance(floor, SQLiteLedger)
            floor.create_session("s")
            run = floor.create_run("s", "a").id
            encoded = [encode_row("s", i + 1, run, row) for i, row in enumerate(news)]
            if not text:
                encoded = [(*e[:-1], "") for e in encoded]
            t0 = time.perf_counter()
            for j in range(0, rows, batch):
                with floor._tx() as c:
                    floor._insert_rows(c, encoded[j : j + batch])
            return time.perf_counter() - t0

    parts: dict[str, list[float]] = {"append": [], "encode": [], "insert": [], "no_text": []}
    for k in range(3):
        parts["append"].append(append(k))
        parts["encode"].append(encode(k))
        parts["insert"].append(insert(k, True))
        parts["no_text"].append(insert(k, False))
    whole, enc, ins, bare = (statistics.median(parts[n]) * 1e6 / rows for n in parts)
    return whole, enc, ins, ins - bare, whole - enc - ins


BREAKDOWN = (
    "append, whole",
    "  encode_row (canonical JSON, sizes, search text)",
    "  insert into the schema (_insert_rows)",
    "    of which the full-text index",
    "  the rest (fence, seq, queries, rows returned)",
)


def bench_breakdown(tmp: Path, rows: int, batch: int, against: Path | None) -> None:
    sides: list[tuple[str, Path | None]] = [("this tree", None)]
    if against is not None:
        sides.append(("--against", against))
    figures = {}
    for label, src in sides:
        scratch = tmp / f"breakdown-{len(figures)}"
        scratch.mkdir()
        argv = ["sqlite-breakdown", str(rows), str(batch), str(scratch)]
        figures[label] = _in_tree(src, argv)
    print(f"\nwhere a SQLite append's time goes, µs per row ({rows:,} rows, batches of {batch}):")
    print(f"  {'':<52}" + "".join(f"{label:>12}" for label in figures))
    for i, name in enumerate(BREAKDOWN):
        print(f"  {name:<52}" + "".join(f"{f[i]:>12.2f}" for f in figures.values()))


def _in_tree(src: Path | None, argv: list[str]) -> list[float]:
    """Run one measurement of this script (``--measure …``) in a subprocess that imports tether
    from ``src`` (this tree's when None); the figures it prints on its last line."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run(
        [sys.executable, __file__, "--measure", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the measurement {argv} from {src or 'this tree'} failed:\n{done.stderr}")
    return [float(x) for x in done.stdout.splitlines()[-1].split()]


def bench_append(
    tmp: Path, rows: int, batch: int, against: Path | None = None, rounds: int = 3
) -> None:
    news = [NewRow.message(actor(i), message(i)) for i in range(rows)]

    # Baseline 1, the headline: what a plain log does with the same rows (RAW_TABLE), json.dumps and
    # executemany into (session, seq, actor, body) with its unique key, a transaction a batch.
    raw = sqlite3.connect(tmp / "raw.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("PRAGMA synchronous = NORMAL")
    raw.execute(RAW_TABLE)
    t0 = time.perf_counter()
    for k in range(0, rows, batch):
        raw.execute("BEGIN IMMEDIATE")
        raw.executemany(
            "INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?)",
            [raw_tuple("s", k + i + 1, r) for i, r in enumerate(news[k : k + batch])],
        )
        raw.execute("COMMIT")
    plain = time.perf_counter() - t0
    raw.close()

    # Baseline 2: tether's own encoded tuples, prepared outside the clock, into the rows table as
    # migration 1 made it (no full-text index, none of the later indexes). What is left is the
    # fence, the seq counter, the encoding, and the schema's later indexes and full-text index.
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
        raw.executemany(INSERT_ROW, encoded[k : k + batch])
        raw.execute("COMMIT")
    pre = time.perf_counter() - t0
    raw.close()

    # Baseline 3, the floor: the same tuples into tether's whole schema (every index, the
    # full-text index and its trigger), the way the ledger inserts them. What is left is the
    # fence, the seq counter and the encoding.
    with open_ledger(f"sqlite://{tmp}/raw3.db") as floor:
        assert isinstance(floor, SQLiteLedger)
        floor.create_session("s")
        run = floor.create_run("s", "a").id
        encoded = [encode_row("s", i + 1, run, row) for i, row in enumerate(news)]
        t0 = time.perf_counter()
        for k in range(0, rows, batch):
            with floor._tx() as c:
                floor._insert_rows(c, encoded[k : k + batch])
        schema = time.perf_counter() - t0

    base: float | None = None
    if against is None:
        ours, ours_cpu = _sqlite_append(tmp / "ledger.db", rows, batch)
    else:
        # Alternate the two trees, `rounds` times each, and take medians: the host's speed moves
        # within minutes. CPU seconds (the writer process's own) move less with other load.
        walls: dict[str, list[float]] = {"ours": [], "base": []}
        cpus: dict[str, list[float]] = {"ours": [], "base": []}
        for i in range(rounds):
            for side, src in (("ours", None), ("base", against)):
                argv = ["sqlite-append", str(rows), str(batch), str(tmp / f"{side}-{i}.db")]
                wall, cpu = _in_tree(src, argv)
                walls[side].append(wall)
                cpus[side].append(cpu)
        ours, ours_cpu = statistics.median(walls["ours"]), statistics.median(cpus["ours"])
        base, base_cpu = statistics.median(walls["base"]), statistics.median(cpus["base"])

    print(f"append {rows:,} rows in batches of {batch} (a transaction a batch):")
    print(f"  raw: json.dumps + executemany           {rows / plain:>10,.0f} rows/s")
    print(f"  raw: pre-encoded, migration 1's table   {rows / pre:>10,.0f} rows/s")
    print(f"  raw: pre-encoded, tether's schema       {rows / schema:>10,.0f} rows/s")
    print(f"  tether append (fenced, seq, measured)   {rows / ours:>10,.0f} rows/s")
    if base is not None:
        print(f"  tether append of --against              {rows / base:>10,.0f} rows/s")
    print(f"  ratio tether : raw json.dumps           {plain / ours:>10.2f}   (target >= 0.6)")
    print(f"  ratio tether : pre-encoded, migration 1 {pre / ours:>10.2f}")
    print(f"  ratio tether : pre-encoded, schema      {schema / ours:>10.2f}")
    if base is not None:
        print(f"  ratio against : raw json.dumps          {plain / base:>10.2f}")
        print(
            f"  ratio tether : against, wall (speed-up) {base / ours:>10.2f}   medians of {rounds}"
        )
        print(f"  ratio tether : against, CPU             {base_cpu / ours_cpu:>10.2f}")


READS: dict[str, Callable[[Ledger, str, int], object]] = {
    "latest_compaction": lambda lg, s, n: lg.latest_compaction(s),
    "last_ended_run": lambda lg, s, n: lg.last_ended_run(s, "reviewer"),
    "row (exact seq)": lambda lg, s, n: lg.row(s, n // 2),
    "tail (240,000 bytes)": lambda lg, s, n: lg.tail(s, 240_000),
    "rows_range (cap 100)": lambda lg, s, n: lg.rows_range(s, n // 2, n, limit=100),
    "notes (bounded)": lambda lg, s, n: lg.notes(s, "reviewer"),
}


def bench_reads(
    url_for: Callable[[int], str], sizes: list[int], repeat: int, label: str = "sqlite"
) -> dict[int, dict[str, float]]:
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        t0 = time.perf_counter()
        with open_ledger(url_for(n)) as ledger:
            fill(ledger, "s", n)
            built = time.perf_counter() - t0
            print(f"built a {label} session of {n:,} rows in {built:.1f} s", flush=True)
            results[n] = {
                name: timed(functools.partial(f, ledger, "s", n), repeat)
                for name, f in READS.items()
            }
    small, large = sizes[0], sizes[-1]
    head = "".join(f"{n:>12,}" for n in sizes)
    print(f"\n{label}: bounded reads, median µs over {repeat} calls, by session length:")
    print(f"  {'read':<24}{head}   ratio {large:,} : {small:,} (target <= 2)")
    for name in READS:
        cells = "".join(f"{results[n][name] * 1e6:>12.1f}" for n in sizes)
        print(f"  {name:<24}{cells}   {results[large][name] / results[small][name]:>6.2f}")
    return results


# -- PostgreSQL ---------------------------------------------------------------------------------

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
WRITERS = (1, 4, 8)


class PgSchemas:
    """Schemas of the bench's own on the server (a fresh one per measurement), dropped at exit."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.prefix = f"bench_{uuid.uuid4().hex[:8]}"
        self.made: list[str] = []

    def url(self, name: str) -> str:
        schema = f"{self.prefix}_{name}"
        with psycopg.connect(self.base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        self.made.append(schema)
        sep = "&" if "?" in self.base else "?"
        return f"{self.base}{sep}options={quote(f'-csearch_path={schema}', safe='')}"

    def __enter__(self) -> PgSchemas:
        return self

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(self.base, autocommit=True) as conn:
            for schema in self.made:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _writer(
    kind: str, url: str, worker: int, rows: int, batch: int, barrier: Barrier, out: Queue[Any]
) -> None:
    """One writer process: append ``rows`` rows to a session of its own, a transaction a batch.
    Puts when it started and ended on the shared monotonic clock."""
    sid = f"w{worker}"
    news = [NewRow.message(actor(i), message(i)) for i in range(rows)]
    if kind == "raw":
        with psycopg.connect(url, autocommit=True) as conn:
            barrier.wait()
            t0 = time.monotonic()
            for k in range(0, rows, batch):
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO log VALUES (%s, %s, %s, %s, %s, %s, %s)",
                        [raw_tuple(sid, k + i + 1, r) for i, r in enumerate(news[k : k + batch])],
                    )
            out.put((t0, time.monotonic()))
        return
    if kind == "raw-schema":
        # tether's own encoded tuples, prepared outside the clock, into tether's schema (with
        # its indexes, the full-text one included): what is left is the fence, the seq counter
        # and the encoding.
        with open_ledger(url) as ledger:
            ledger.create_session(sid)
            run = ledger.create_run(sid, "a").id
        encoded = [encode_row(sid, i + 1, run, row) for i, row in enumerate(news)]
        with psycopg.connect(url, autocommit=True) as conn:
            barrier.wait()
            t0 = time.monotonic()
            for k in range(0, rows, batch):
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(_dialect(INSERT_ROW), encoded[k : k + batch])
            out.put((t0, time.monotonic()))
        return
    with open_ledger(url) as ledger:
        ledger.create_session(sid)
        fence = ledger.claim_run(ledger.create_run(sid, "a").id)
        barrier.wait()
        t0 = time.monotonic()
        for k in range(0, rows, batch):
            ledger.append(fence, news[k : k + batch])
        out.put((t0, time.monotonic()))


def _throughput(kind: str, url: str, writers: int, rows: int, batch: int) -> float:
    """Rows per second of ``writers`` processes appending ``rows`` rows between them."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(writers)
    out: Queue[Any] = ctx.Queue()
    each = rows // writers
    procs = [
        ctx.Process(target=_writer, args=(kind, url, w, each, batch, barrier, out))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    spans = []
    while len(spans) < writers:
        try:
            spans.append(out.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.terminate()
                raise SystemExit(f"a {kind} writer failed; see its traceback above") from None
    for p in procs:
        p.join()
    return each * writers / (max(e for _, e in spans) - min(s for s, _ in spans))


def bench_concurrent_append(
    tmp: Path,
    schemas: PgSchemas,
    rows: int,
    batch: int,
    against: Path | None = None,
    rounds: int = 1,
) -> None:
    print(f"append {rows:,} rows in batches of {batch}, split over N writer processes, each on")
    print(f"a session of its own (a transaction a batch), rows/s, medians of {rounds}:")
    print("  raw: json.dumps + executemany of the row record's fields (see RAW_TABLE);")
    print("  pre: tether's encoded tuples, prepared outside the clock, into tether's schema.")
    head = (
        f"  {'writers':<8}{'pg raw':>10}{'pg pre':>10}{'pg tether':>11}{'sqlite tether':>15}"
        f"{'tether:raw':>12}{'tether:pre':>12}"
    )
    if against is not None:
        head += f"{'pg against':>12}{'against:raw':>13}{'speed-up':>10}"
    print(head)
    for n in WRITERS:
        # Each figure is the median of `rounds` measurements, taken in turn (raw, pre, tether,
        # --against, then again): the host's speed moves within seconds.
        got: dict[str, list[float]] = {k: [] for k in ("raw", "pre", "pg", "lite", "base")}
        for i in range(rounds):
            raw_url = schemas.url(f"raw{n}_{i}")
            with psycopg.connect(raw_url, autocommit=True) as conn:
                conn.execute(RAW_TABLE)
            got["raw"].append(_throughput("raw", raw_url, n, rows, batch))
            got["pre"].append(_throughput("raw-schema", schemas.url(f"pre{n}_{i}"), n, rows, batch))
            argv = ["throughput", "tether", str(n), str(rows), str(batch)]
            lite_url = f"sqlite://{tmp}/append-{n}-{i}.db"
            if against is None:
                got["pg"].append(
                    _throughput("tether", schemas.url(f"append{n}_{i}"), n, rows, batch)
                )
                got["lite"].append(_throughput("tether", lite_url, n, rows, batch))
            else:
                got["pg"].append(_in_tree(None, [*argv, schemas.url(f"append{n}_{i}")])[0])
                got["lite"].append(_in_tree(None, [*argv, lite_url])[0])
                got["base"].append(_in_tree(against, [*argv, schemas.url(f"against{n}_{i}")])[0])
        raw, pre, pg, lite = (statistics.median(got[k]) for k in ("raw", "pre", "pg", "lite"))
        line = (
            f"  {n:<8}{raw:>10,.0f}{pre:>10,.0f}{pg:>11,.0f}{lite:>15,.0f}"
            f"{pg / raw:>12.2f}{pg / pre:>12.2f}"
        )
        if against is not None:
            base = statistics.median(got["base"])
            line += f"{base:>12,.0f}{base / raw:>13.2f}{pg / base:>10.2f}"
        print(line, flush=True)


# The ways PostgreSQL could keep recall's text index, each on the raw table plus the row's
# search text (what tether derives once at append): without an index; tether's GIN index on the
# expression; a tsvector column filled at append (generated from the same expression) with a
# GIN index on it; the same expression index with fastupdate off. Every one but the first parses
# the text with to_tsvector at insert: what differs is where the lexemes live.
TEXT_INDEXES = {
    "none": "",
    "expression (tether)": "CREATE INDEX log_fts ON log USING gin ({doc})",
    "lexeme column": (
        "ALTER TABLE log ADD COLUMN lexemes tsvector GENERATED ALWAYS AS ({doc}) STORED;"
        "CREATE INDEX log_fts ON log USING gin (lexemes)"
    ),
    "expression, fastupdate off": (
        "CREATE INDEX log_fts ON log USING gin ({doc}) WITH (fastupdate = off)"
    ),
}


def bench_pg_text_index(schemas: PgSchemas, rows: int, batch: int, rounds: int) -> None:
    """Raw inserts (one writer, a transaction a batch) into the raw table with its search
    text, under each of TEXT_INDEXES, in turn ``rounds`` times: rows/s, and against none."""
    from tether.ledger.ddl.postgres import FTS_SESSION_DOCUMENT
    from tether.ledger.text import row_text

    news = [NewRow.message(actor(i), message(i)) for i in range(rows)]
    tuples = [(*raw_tuple("s", i + 1, r), row_text(r.kind, r.body)) for i, r in enumerate(news)]
    got: dict[str, list[float]] = {name: [] for name in TEXT_INDEXES}
    for i in range(rounds):
        for k, (name, ddl) in enumerate(TEXT_INDEXES.items()):
            with psycopg.connect(schemas.url(f"text{k}_{i}"), autocommit=True) as conn:
                conn.execute(RAW_TABLE.replace("body TEXT,", "body TEXT, text TEXT,"))
                for statement in filter(None, ddl.format(doc=FTS_SESSION_DOCUMENT).split(";")):
                    conn.execute(statement)
                t0 = time.perf_counter()
                for j in range(0, rows, batch):
                    with conn.transaction(), conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO log VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            tuples[j : j + batch],
                        )
                got[name].append(rows / (time.perf_counter() - t0))
    print(
        f"\npostgres text index, {rows:,} raw inserts with their search text, batches of "
        f"{batch}, one writer, medians of {rounds}:"
    )
    none = statistics.median(got["none"])
    for name, found in got.items():
        rate = statistics.median(found)
        print(f"  {name:<28}{rate:>10,.0f} rows/s   {rate / none:5.2f} of no index")


def measure(argv: list[str]) -> None:
    """One measurement in this process (``--against`` runs these in another tree's tether)."""
    what, rest = argv[0], argv[1:]
    if what == "sqlite-append":
        print(*_sqlite_append(Path(rest[2]), int(rest[0]), int(rest[1])))
    elif what == "sqlite-breakdown":
        print(*_sqlite_breakdown(Path(rest[2]), int(rest[0]), int(rest[1])))
    elif what == "throughput":
        kind, writers, rows, batch, url = rest
        print(_throughput(kind, url, int(writers), int(rows), int(batch)))
    else:
        raise SystemExit(f"unknown measurement {what!r}")


def bench_tail_over_huge_rows(tmp: Path, repeat: int) -> None:
    """The tail past the budget: 300 rows of 1 MB below one small row. A tail that read the
    bodies of a whole page before looking at sizes would read 256 MB to return 60 bytes."""
    with open_ledger(f"sqlite://{tmp}/huge.db") as ledger:
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        big = NewRow.message(
            "tool:read",
            {
                "role": "toolResult",
                "toolCallId": "c",
                "content": [{"type": "text", "text": "x" * 10**6}],
            },
        )
        for _ in range(10):
            ledger.append(fence, [big] * 30)
        small = {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
        ledger.append(fence, [NewRow.message("agent:a", small)])
        baseline = timed(functools.partial(ledger.row, "s", 301), repeat)
        tail = timed(functools.partial(ledger.tail, "s", 240_000), repeat)
    print("\ntail (240,000 bytes) over 300 rows of 1 MB below one small row, median µs:")
    print(f"  one exact row (baseline) {baseline * 1e6:>10.1f}")
    print(f"  tail                     {tail * 1e6:>10.1f}   ratio {tail / baseline:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="sessions of 10^3, 10^4, 10^5 rows")
    parser.add_argument("--append-rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--postgres", default=os.environ.get("TETHER_TEST_POSTGRES_URL", PG_URL))
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--no-reads", action="store_true", help="appends only")
    parser.add_argument(
        "--against",
        type=Path,
        help="also time the appends of this checkout's ledger (before/after)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measurements per figure, taken in turn (SQLite appends: with --against only)",
    )
    parser.add_argument(
        "--text-index",
        action="store_true",
        help="also time PostgreSQL inserts under each way of keeping the text index",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also show where a SQLite append's time goes (both trees with --against)",
    )
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return
    against: Path | None = None
    if args.against is not None:
        against = (
            args.against / "src" if (args.against / "src" / "tether").is_dir() else args.against
        )
        if not (against / "tether" / "ledger").is_dir():
            raise SystemExit(f"--against {args.against}: no tether/ledger there nor in its src/")
        against = against.resolve()
    sizes = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**5, 10**6]
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as d:
        tmp = Path(d)
        bench_append(tmp, args.append_rows, args.batch, against, args.rounds)
        if args.breakdown:
            bench_breakdown(tmp, args.append_rows, args.batch, against)
        if not args.no_reads:
            bench_tail_over_huge_rows(tmp, 50)
            sqlite_reads = bench_reads(lambda n: f"sqlite://{tmp}/reads-{n}.db", sizes, args.repeat)
        if args.no_postgres:
            return
        with PgSchemas(args.postgres) as schemas:
            print()
            bench_concurrent_append(
                tmp, schemas, args.append_rows, args.batch, against, args.rounds
            )
            if args.text_index:
                bench_pg_text_index(schemas, args.append_rows, args.batch, args.rounds)
            if args.no_reads:
                return
            pg_sizes = [sizes[0], sizes[-1]]
            pg_reads = bench_reads(
                lambda n: schemas.url(f"reads{n}"), pg_sizes, args.repeat, "postgres"
            )
        print("\npostgres : sqlite, the same bounded read on the same session length:")
        print("  " + f"{'read':<24}" + "".join(f"{n:>12,}" for n in pg_sizes))
        for name in READS:
            cells = "".join(f"{pg_reads[n][name] / sqlite_reads[n][name]:>12.2f}" for n in pg_sizes)
            print(f"  {name:<24}{cells}")


if __name__ == "__main__":
    main()
