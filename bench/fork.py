"""Fork benchmark (docs/operations.md#erasure-and-retention): a fork is by reference, so forking a
session of 10^6 rows takes
the time of forking one of 10^3. Each session is written in runs of 10^4 rows (the small one in
one run); the bench forks each at its last run and at a run in its middle, many times, and
reports the median, then builds the follow-up view of a fork and of its session (both bounded).

    .venv/bin/python bench/fork.py                       # SQLite, 10^3 and 10^6 rows
    .venv/bin/python bench/fork.py --rows 100000         # a smaller large session
    .venv/bin/python bench/fork.py --postgres URL        # PostgreSQL too (a schema of its own)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tether.config import FollowupConfig
from tether.followup import FollowupView, build_view
from tether.ledger import Ledger, Row, RowKind, Run, RunStatus, Session, open_ledger
from tether.ledger.models import now_iso
from tether.sizes import measure

RUN_ROWS = 10_000
FORKS = 50


def _message(i: int) -> dict[str, Any]:
    role = "user" if i % RUN_ROWS == 0 else "assistant"
    return {"role": role, "content": [{"type": "text", "text": f"row {i} " + "x" * 200}]}


def fill(ledger: Ledger, session: str, rows: int) -> list[str]:
    """``rows`` rows in runs of at most :data:`RUN_ROWS` (written as ``ledger load`` writes,
    in one transaction: appends one by one would take most of the bench); the run ids."""
    stamp = now_iso()
    runs: list[Run] = []
    for k in range(0, rows, RUN_ROWS):
        runs.append(
            Run(
                id=f"r-{uuid.uuid4().hex[:12]}",
                session=session,
                agent="rev",
                status=RunStatus.FINISHED,
                request_seq=k + 1,
                started=stamp,
                ended=stamp,
            )
        )

    def made() -> Iterator[Row]:
        for i in range(rows):
            body = _message(i)
            yield Row(
                session=session,
                seq=i + 1,
                run=runs[i // RUN_ROWS].id,
                actor="user:ana" if i % RUN_ROWS == 0 else "agent:rev",
                kind=RowKind.MESSAGE,
                body=body,
                sources=(),
                bytes=measure(body).text_bytes,
            )

    ledger.import_records([Session(id=session, created=stamp)], runs, made(), [])
    return [r.id for r in runs]


def timed_forks(ledger: Ledger, session: str, at: str) -> float:
    """The median seconds of :data:`FORKS` forks of ``session`` at run ``at``."""
    took: list[float] = []
    for _ in range(FORKS):
        name = f"f-{uuid.uuid4().hex[:12]}"
        start = time.perf_counter()
        ledger.fork_session(session, at, name)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def timed_view(ledger: Ledger, session: str) -> float:
    took: list[float] = []
    for _ in range(5):
        start = time.perf_counter()
        view = build_view(
            ledger,
            session=session,
            agent="rev",
            actor="user:ana",
            request="and now?",
            config=FollowupConfig(budget_bytes=240_000),
            grants={"user:ana": ["*"]},
        )
        took.append(time.perf_counter() - start)
        assert isinstance(view, FollowupView), view
    return statistics.median(took)


def bench(ledger: Ledger, engine: str, sizes: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rows in sizes:
        session = f"s{rows}"
        start = time.perf_counter()
        runs = fill(ledger, session, rows)
        filled = time.perf_counter() - start
        last = timed_forks(ledger, session, runs[-1])
        middle = timed_forks(ledger, session, runs[len(runs) // 2])
        fork = f"view-{rows}"
        ledger.fork_session(session, runs[-1], fork)
        out.append(
            {
                "engine": engine,
                "rows": rows,
                "fill_s": round(filled, 1),
                "fork_at_last_run_ms": round(last * 1000, 3),
                "fork_at_middle_run_ms": round(middle * 1000, 3),
                "view_of_session_ms": round(timed_view(ledger, session) * 1000, 2),
                "view_of_fork_ms": round(timed_view(ledger, fork) * 1000, 2),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="the large session's rows")
    parser.add_argument("--postgres", help="a PostgreSQL URL: bench it too")
    args = parser.parse_args()
    sizes = [1_000, args.rows]
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_ledger(f"sqlite://{Path(tmp) / 'fork.db'}") as ledger,
    ):
        results += bench(ledger, "sqlite", sizes)
    if args.postgres:
        schema = f"bench_fork_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            try:
                sep = "&" if "?" in args.postgres else "?"
                url = f"{args.postgres}{sep}options={quote(f'-csearch_path={schema}')}"
                with open_ledger(url) as ledger:
                    results += bench(ledger, "postgresql", sizes)
            finally:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")
    for engine in ("sqlite", "postgresql"):
        mine = [r for r in results if r["engine"] == engine]
        if len(mine) == 2:
            small, large = mine
            ratio = large["fork_at_last_run_ms"] / small["fork_at_last_run_ms"]
            print(
                f"{engine}: a fork of {large['rows']:,} rows takes {ratio:.2f}× the time of a fork "
                f"of {small['rows']:,} ({large['fork_at_last_run_ms']} ms vs "
                f"{small['fork_at_last_run_ms']} ms)"
            )


if __name__ == "__main__":
    main()
