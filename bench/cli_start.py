"""CLI start-up benchmark: wall time of short ``tether`` commands, as a user's shell runs them.

Each command runs N times, interleaved with the baseline (the same interpreter doing nothing,
``python -c pass``), in a scratch directory holding a SQLite ledger with the bundled example
session; the minimum and the median are printed, and each median's ratio to the baseline's.
The target (issue 10) is at most 150 ms for ``tether --help`` and ``tether context``.

    .venv/bin/python bench/cli_start.py             # 20 repetitions
    .venv/bin/python bench/cli_start.py --reps 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "src" / "tether" / "examples" / "review.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tether-start-"))
    env = {**os.environ, "TETHER_CONFIG": str(work / "tether.toml")}
    (work / "tether.toml").write_text(f'[ledger]\nurl = "sqlite://{work}/ledger.db"\n')
    tether = [sys.executable, "-m", "tether"]
    subprocess.run([*tether, "ledger", "load", str(EXAMPLE)], env=env, cwd=work, check=True)
    session = "review-42"
    commands = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "tether --help": [*tether, "--help"],
        "tether context": [*tether, "context", "-s", session, "-a", "reviewer", "--json"],
        "tether run --help": [*tether, "run", "--help"],
    }
    for argv in commands.values():  # warm the file cache and the .pyc files once
        subprocess.run(argv, env=env, cwd=work, capture_output=True, check=True)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.reps):
        for name, argv in commands.items():
            t = time.perf_counter()
            subprocess.run(argv, env=env, cwd=work, capture_output=True, check=True)
            times[name].append(time.perf_counter() - t)

    base = statistics.median(times["python -c pass (baseline)"])
    print(f"CLI start: {args.reps} repetitions each, interleaved ({sys.executable})")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {name:28s} min {min(ts) * 1000:6.1f} ms   median {med * 1000:6.1f} ms   "
            f"ratio to baseline {med / base:5.2f}"
        )


if __name__ == "__main__":
    main()
