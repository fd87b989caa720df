"""pi import benchmark: time and peak memory of ``tether import pi`` as the pi file grows.

For pi session files of 10^4 and 10^5 entries (about 1 KB of text each, in turns of a request, a
tool call, its result and an answer; a pi compaction every 1,000 entries; a label every 500; an
abandoned branch of 1,000 entries near the end and the branch summary pi writes for it), it runs
``tether import pi`` in a child process on a SQLite ledger and prints its wall time and peak RSS.
The baseline, measured in the same run, is ``tether ledger load`` of the same session as ledger
JSON Lines (written by ``tether ledger dump``), which reads its whole file into memory before the
transaction. Printed: import : load, for time and for peak RSS, and the growth of each from 10^4
to 10^5 entries.

    .venv/bin/python bench/interop.py            # 10^4 and 10^5 entries
    .venv/bin/python bench/interop.py --quick    # 10^3 and 10^4 entries
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TEXT = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 18  # ≈ 1 KB


def _stamp(i: int) -> str:
    return f"2026-11-{1 + i // 86_400_000 % 28:02d}T00:00:00.000Z"


def write_pi_file(path: Path, n: int) -> int:
    """A v3 pi session file of about ``n`` entries; returns its entry count."""
    count = 0
    with path.open("w") as f:
        f.write(
            json.dumps(
                {
                    "type": "session",
                    "version": 3,
                    "id": "bench",
                    "timestamp": _stamp(0),
                    "cwd": "/w",
                }
            )
            + "\n"
        )
        parent: str | None = None
        users: list[str] = []

        def put(entry: dict[str, Any], *, attach: str | None = "leaf") -> str:
            nonlocal parent, count
            eid = f"{count:08x}"
            entry = {
                **entry,
                "id": eid,
                "parentId": parent if attach == "leaf" else attach,
                "timestamp": _stamp(count),
            }
            f.write(json.dumps(entry) + "\n")
            parent = eid
            count += 1
            return eid

        def turn(k: int) -> None:
            ms = 1_780_000_000_000 + count
            users.append(
                put(
                    {
                        "type": "message",
                        "message": {
                            "role": "user",
                            "content": f"task {k}: {TEXT}",
                            "timestamp": ms,
                        },
                    }
                )
            )
            call = {"type": "toolCall", "id": f"c{k}", "name": "bash", "arguments": {"c": "ls"}}
            put(
                {
                    "type": "message",
                    "message": {
                        "role": "assistant",
                        "content": [call],
                        "stopReason": "toolUse",
                        "timestamp": ms,
                    },
                }
            )
            put(
                {
                    "type": "message",
                    "message": {
                        "role": "toolResult",
                        "toolCallId": f"c{k}",
                        "toolName": "bash",
                        "content": [{"type": "text", "text": TEXT}],
                        "isError": False,
                        "timestamp": ms,
                    },
                }
            )
            put(
                {
                    "type": "message",
                    "message": {
                        "role": "assistant",
                        "content": [{"type": "text", "text": TEXT}],
                        "stopReason": "stop",
                        "timestamp": ms,
                    },
                }
            )

        k = 0
        branch_at = n - 2000
        while count < n:
            turn(k)
            k += 1
            if count // 500 != (count - 4) // 500:
                put({"type": "label", "targetId": users[-1], "label": f"l{k}"})
            if count // 1000 != (count - 5) // 1000 and len(users) > 3:
                put(
                    {
                        "type": "compaction",
                        "summary": f"summary up to turn {k}. {TEXT}",
                        "firstKeptEntryId": users[-3],
                        "tokensBefore": 50_000,
                    }
                )
            if branch_at > 0 and count >= branch_at:
                fork = parent
                while count < branch_at + 1000:  # the abandoned branch
                    turn(k)
                    k += 1
                put(
                    {"type": "branch_summary", "fromId": parent, "summary": "abandoned"},
                    attach=fork,
                )
                branch_at = 0
    return count


def _run(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed: {proc.stderr.read().decode() if proc.stderr else ''}"
        )
    return elapsed, usage.ru_maxrss * 1024


def measure(n: int, tmp: Path) -> dict[str, float]:
    pi_file = tmp / f"pi-{n}.jsonl"
    entries = write_pi_file(pi_file, n)
    tether = [sys.executable, "-m", "tether"]
    db = f"sqlite://{tmp}/import-{n}.db"
    t_import, rss_import = _run(
        [*tether, "import", "pi", str(pi_file), "-s", "s", "-a", "a", "--ledger", db]
    )
    dump = tmp / f"dump-{n}.jsonl"
    with dump.open("w") as out:
        subprocess.run(
            [*tether, "ledger", "dump", "-s", "s", "--ledger", db], stdout=out, check=True
        )
    t_load, rss_load = _run(
        [*tether, "ledger", "load", str(dump), "--ledger", f"sqlite://{tmp}/load-{n}.db"]
    )
    size = pi_file.stat().st_size
    print(
        f"{entries:>7} entries, pi file {size / 1e6:6.1f} MB: import pi {t_import:6.2f} s, "
        f"peak RSS {rss_import / 1e6:6.1f} MB | ledger load {t_load:6.2f} s, "
        f"peak RSS {rss_load / 1e6:6.1f} MB | import : load  time {t_import / t_load:.2f}, "
        f"RSS {rss_import / rss_load:.2f}"
    )
    return {"t": t_import, "rss": rss_import, "t_load": t_load, "rss_load": rss_load, "size": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    small, large = (1_000, 10_000) if args.quick else (10_000, 100_000)
    with tempfile.TemporaryDirectory() as d:
        a = measure(small, Path(d))
        b = measure(large, Path(d))
    print(
        f"growth {small} -> {large} entries: pi file x{b['size'] / a['size']:.1f}; import pi "
        f"RSS x{b['rss'] / a['rss']:.2f} (ledger load x{b['rss_load'] / a['rss_load']:.2f}), "
        f"time x{b['t'] / a['t']:.1f} (ledger load x{b['t_load'] / a['t_load']:.1f})"
    )


if __name__ == "__main__":
    main()
