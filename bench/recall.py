"""Recall benchmark: ranked full-text search (``tether.recall.search``, the answer the tool gives)
on sessions of 10^3, 10^5 and 10^6 rows, against a ``LIKE '%term%'`` scan of the same rows at
the largest size, measured in the same run. Every figure is a ratio against a baseline measured
here: the search at 10^6 rows against the search at 10^3 (it should stay within 3x for a
selective term), and the LIKE scan at 10^6 against the search at 10^6.

    .venv/bin/python bench/recall.py                   # SQLite, 10^3, 10^5, 10^6 rows
    .venv/bin/python bench/recall.py --quick           # 10^3, 10^4, 10^5 rows
    .venv/bin/python bench/recall.py --postgres URL    # PostgreSQL too (a schema of its own)

Each session's rows are ordinary messages of twelve words drawn from a 20,000-word vocabulary;
the selective term is in exactly 5 rows of each session, spread over it. On PostgreSQL each load
is followed by ``VACUUM ANALYZE`` (what autovacuum does after it): until then every search also
scans the GIN index's pending list of new entries.

Two more ratios show that recall's reads are bounded by the session, not by the ledger:

- crowd: a search of a small session (1,000 rows, the term in 5) once the ledger also holds
  other sessions whose every row holds the term, against the same search measured before they
  were added (should stay near 1);
- range: ``read_range`` over 500 rows of 20 KB each (an answer holds one of them), against the
  same call over 500 rows of 100 bytes (should stay near 1: the big rows past the answer are
  never read).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg

from tether.ledger import Ledger, Row, RowKind, Run, RunStatus, Session, open_ledger
from tether.ledger.postgres import _dialect
from tether.recall import read_range, search

TERM = "quasarflux"
HITS = 5
WORDS_PER_ROW = 12
VOCABULARY = 20_000


def vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    out: set[str] = set()
    while len(out) < VOCABULARY:
        out.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    out.discard(TERM)
    return sorted(out)


def rows(session: str, run: str, n: int, rng: random.Random, words: list[str]) -> Iterator[Row]:
    marked = {1 + (i * n) // HITS + n // (2 * HITS) for i in range(HITS)}
    for seq in range(1, n + 1):
        text = " ".join(rng.choices(words, k=WORDS_PER_ROW))
        if seq in marked:
            text += f" {TERM}"
        body = {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": seq}
        yield Row(session, seq, run, "user:bench", RowKind.MESSAGE, body, (), 0)


def fill(ledger: Ledger, session: str, n: int, words: list[str]) -> None:
    run = f"r-{session}"
    ledger.import_records(
        [Session(session, "2026-12-01T00:00:00Z")],
        [Run(run, session, "bench", RunStatus.FINISHED)],
        rows(session, run, n, random.Random(n), words),
        [],
    )


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of ``reps`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(
    name: str,
    ledger: Ledger,
    sizes: list[int],
    like: Callable[[str], int],
    settle: Callable[[], None] = lambda: None,
) -> None:
    words = vocabulary(random.Random(7))
    found: dict[int, float] = {}
    for n in sizes:
        session = f"s{n}"
        start = time.perf_counter()
        fill(ledger, session, n, words)
        settle()
        loaded = time.perf_counter() - start
        answer = search(ledger, session, TERM, actor=None, grants={})
        assert len(answer.hits) == HITS, answer.to_json()
        found[n] = timed(lambda s=session: search(ledger, s, TERM, actor=None, grants={}), 30)
        print(
            f"{name}: {n:>9,} rows (loaded in {loaded:6.1f} s): "
            f"recall search {found[n] * 1e3:8.3f} ms"
        )
    small, large = min(sizes), max(sizes)
    scan = timed(lambda: like(f"s{large}"), 3)
    print(
        f"{name}: search at {large:,} : search at {small:,} = "
        f"{found[large] / found[small]:.2f}  (target <= 3)"
    )
    print(
        f"{name}: LIKE '%{TERM}%' scan at {large:,} rows {scan * 1e3:.1f} ms = "
        f"{scan / found[large]:.0f}x the search"
    )


CROWD_TERM = "crowdedword"
CROWD_SESSIONS = 20


def crowd_rows(session: str, run: str, n: int, every: int, size: int = 0) -> Iterator[Row]:
    """Rows holding CROWD_TERM every ``every`` rows, padded to about ``size`` bytes."""
    rng = random.Random(session)
    for seq in range(1, n + 1):
        text = " ".join(f"w{rng.randrange(5000)}" for _ in range(WORDS_PER_ROW))
        if seq % every == 0:
            text += f" {CROWD_TERM}"
        if size > len(text):
            text += " " + "pad " * ((size - len(text)) // 4)
        body = {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": seq}
        yield Row(session, seq, run, "user:bench", RowKind.MESSAGE, body, (), 0)


def fill_crowd(ledger: Ledger, session: str, n: int, every: int, size: int = 0) -> None:
    run = f"r-{session}"
    ledger.import_records(
        [Session(session, "2026-12-01T00:00:00Z")],
        [Run(run, session, "bench", RunStatus.FINISHED)],
        crowd_rows(session, run, n, every, size),
        [],
    )


def bench_bounded(
    name: str, ledger: Ledger, crowd_rows_each: int, settle: Callable[[], None] = lambda: None
) -> None:
    """Recall's reads against the session's own size: other sessions' matches, and big rows
    past a range's answer, must not add work."""
    fill_crowd(ledger, "small", 1000, 200)
    settle()

    def find() -> object:
        answer = search(ledger, "small", CROWD_TERM, actor=None, grants={})
        assert len(answer.hits) == HITS, answer.to_json()
        return answer

    alone = timed(find, 30)
    start = time.perf_counter()
    for i in range(CROWD_SESSIONS):
        fill_crowd(ledger, f"crowd{i}", crowd_rows_each, 1)
    settle()
    loaded = time.perf_counter() - start
    crowded = timed(find, 30)
    others = CROWD_SESSIONS * crowd_rows_each
    print(
        f"{name}: search of a 1,000-row session with {others:,} matching rows in "
        f"{CROWD_SESSIONS} other sessions (loaded in {loaded:.1f} s) : alone = "
        f"{crowded / alone:.2f}  ({crowded * 1e3:.2f} ms against {alone * 1e3:.2f} ms)"
    )

    fill_crowd(ledger, "narrow", 500, 10**9, 100)
    fill_crowd(ledger, "wide", 500, 10**9, 20_000)
    settle()

    def read(session: str) -> Callable[[], object]:
        return lambda: read_range(ledger, session, 1, 500, actor=None, grants={})

    narrow = timed(read("narrow"), 30)
    wide = timed(read("wide"), 30)
    print(
        f"{name}: read_range 1-500 over rows of 20 KB : over rows of 100 B = "
        f"{wide / narrow:.2f}  ({wide * 1e3:.2f} ms against {narrow * 1e3:.2f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10^3, 10^4, 10^5 rows")
    parser.add_argument("--postgres", metavar="URL", help="also bench PostgreSQL at URL")
    parser.add_argument("--no-sqlite", action="store_true", help="skip SQLite")
    parser.add_argument(
        "--bounded-only", action="store_true", help="only the crowd and range ratios"
    )
    args = parser.parse_args()
    sizes = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**5, 10**6]
    crowd_each = 2000 if args.quick else 10_000

    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite://{Path(tmp) / 'recall.db'}"
            with open_ledger(url) as ledger:
                conn = ledger._conn  # type: ignore[attr-defined]

                def like_sqlite(session: str) -> int:
                    sql = "SELECT seq FROM rows WHERE session = ? AND text LIKE ?"
                    return len(conn.execute(sql, (session, f"%{TERM}%")).fetchall())

                if not args.bounded_only:
                    bench("sqlite", ledger, sizes, like_sqlite)
            with open_ledger(f"sqlite://{Path(tmp) / 'bounded.db'}") as ledger:
                bench_bounded("sqlite", ledger, crowd_each)

    if args.postgres:
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in args.postgres else "?"
        url = f"{args.postgres}{sep}options={quote(f'-csearch_path={schema}', safe='')}"
        try:
            with open_ledger(url) as ledger, psycopg.connect(url, autocommit=True) as conn:

                def settle_pg() -> None:
                    # What autovacuum does after a bulk load: merge the GIN index's pending list
                    # (which every search scans until then) and gather statistics.
                    conn.execute("VACUUM ANALYZE rows")

                def like_pg(session: str) -> int:
                    sql = _dialect("SELECT seq FROM rows WHERE session = ? AND text LIKE ?")
                    return len(conn.execute(sql, (session, f"%{TERM}%")).fetchall())

                if not args.bounded_only:
                    bench("postgres", ledger, sizes, like_pg, settle_pg)
                bench_bounded("postgres", ledger, crowd_each, settle_pg)
        finally:
            with psycopg.connect(args.postgres, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
