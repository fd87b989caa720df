"""Peak memory of `ledger load` against the size of the file (issue 12: bounded, ≤ 300 MB).

Writes interchange files of two sizes (default 110 MB and 1.1 GB: one session, rows of ~2 KB
of text), loads each into a fresh SQLite ledger in its own process, and prints each process's
peak resident memory and the ratio between them: a loader that holds the file grows with it
(ratio ≈ the size ratio), a streaming one stays flat (ratio ≈ 1).

    python bench/load_memory.py [SMALL_MB LARGE_MB]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD = """
import sys
from tether.ledger import open_ledger
from tether.ledger.jsonl import load_file
with open_ledger(sys.argv[1]) as ledger:
    report = load_file(ledger, sys.argv[2])
print(report.rows)
"""


def write_file(path: Path, megabytes: int) -> int:
    text = ("The token bucket refills at rate r; take() must hold the lock. " * 32)[:2000]
    target = megabytes * 1024 * 1024
    written = 0
    seq = 0
    with path.open("w", encoding="utf-8") as f:
        head = [
            {"type": "session", "id": "big", "created": "2026-11-29T10:00:00Z"},
            {
                "type": "run",
                "id": "r1",
                "session": "big",
                "agent": "a",
                "status": "finished",
                "request_seq": 1,
                "started": None,
                "ended": None,
            },
        ]
        for rec in head:
            written += f.write(json.dumps(rec) + "\n")
        while written < target:
            seq += 1
            role = "user" if seq % 2 else "assistant"
            msg = {
                "role": role,
                "content": [{"type": "text", "text": f"{seq} {text}"}],
                "timestamp": 1764410401000 + seq,
            }
            rec = {
                "type": "row",
                "session": "big",
                "seq": seq,
                "run": "r1",
                "actor": "user:ana" if seq % 2 else "agent:a",
                "sources": [],
                "message": msg,
            }
            written += f.write(json.dumps(rec) + "\n")
    return seq


def peak_rss_mb(ledger_url: str, path: Path) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", LOAD, ledger_url, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    )
    took = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest child so far: each load is larger than the last
    return max(peak, before) / 1024, took, out.stdout.strip()


def main() -> None:
    small, large = (int(a) for a in sys.argv[1:3]) if len(sys.argv) == 3 else (110, 1100)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        results = []
        for mb in (small, large):
            path = Path(tmp) / f"{mb}.jsonl"
            rows = write_file(path, mb)
            size = path.stat().st_size / 1024 / 1024
            rss, took, loaded = peak_rss_mb(f"sqlite:{tmp}/{mb}.db", path)
            assert loaded == str(rows), (loaded, rows)
            results.append((size, rss))
            print(f"file {size:8.1f} MB  {rows:>8} rows  peak RSS {rss:7.1f} MB  {took:6.1f} s")
            path.unlink()
            Path(f"{tmp}/{mb}.db").unlink()
        (s_size, s_rss), (l_size, l_rss) = results
        print(f"file size ratio {l_size / s_size:.1f}x, peak RSS ratio {l_rss / s_rss:.2f}x")


if __name__ == "__main__":
    main()
