"""CLI start-up benchmark: wall and CPU time of short ``tether`` commands, as a shell runs them.

Each command runs N times, interleaved with the baseline (the same interpreter doing nothing,
``python -c pass``), in a scratch directory holding a SQLite ledger with the bundled example
session. Printed per command: the minimum and median wall time, the median CPU time (user +
system of the process; less moved by other load on a shared machine than wall time), and the
median wall time's ratio to the baseline's. With ``--against SRC`` the same commands also run
from another source tree (e.g. main's ``src``), interleaved, so before and after come from one
run. The target (issue 10) is at most 150 ms for ``tether --help`` and ``tether context``.

Timed as installed: an installed package (pip compiles it) or a checkout imports cached bytecode.
This workplace sets PYTHONDONTWRITEBYTECODE, which would compile every module of tether at every
start; the timed processes run without it, with their bytecode in a scratch PYTHONPYCACHEPREFIX
(so no other tree is written to), filled by one warm-up run of each command.

    PYTHONPATH=$PWD/src .venv/bin/python bench/cli_start.py [--reps 20] [--against ../main/src]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "src" / "tether" / "examples" / "review.jsonl"


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--against", type=Path, help="another src/ to time the same commands from")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tether-start-"))
    here = os.environ.get("PYTHONPATH", str(ROOT / "src"))
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "PYTHONPYCACHEPREFIX": str(work / "pycache"),
        "PYTHONPATH": here,
    }
    tether = [sys.executable, "-m", "tether"]

    def with_ledger(config: Path, tree_env: dict[str, str]) -> dict[str, str]:
        """``tree_env`` with a config of its own whose SQLite ledger holds the example session,
        loaded by that tree (a tree from before a migration cannot open a newer schema)."""
        config.write_text(f'[ledger]\nurl = "sqlite://{config.with_suffix(".db")}"\n')
        tree_env = {**tree_env, "TETHER_CONFIG": str(config)}
        load = [*tether, "ledger", "load", str(EXAMPLE)]
        subprocess.run(load, env=tree_env, cwd=work, check=True, capture_output=True)
        return tree_env

    env = with_ledger(work / "tether.toml", env)
    commands = {
        "tether --help": [*tether, "--help"],
        "tether context": [*tether, "context", "-s", "review-42", "-a", "reviewer", "--json"],
        "tether run --help": [*tether, "run", "--help"],
    }
    trees = {"": env}
    if args.against:
        against = {**env, "PYTHONPATH": str(args.against.resolve())}
        trees[" (against)"] = with_ledger(work / "against.toml", against)
    runs = {"python -c pass (baseline)": ([sys.executable, "-c", "pass"], env)}
    for label, tree_env in trees.items():
        runs |= {name + label: (argv, tree_env) for name, argv in commands.items()}
    for argv, run_env in runs.values():  # warm the file cache and the .pyc files once
        subprocess.run(argv, env=run_env, cwd=work, capture_output=True, check=True)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, (argv, run_env) in runs.items():
            wall, cpu = timed(argv, run_env, work)
            walls[name].append(wall)
            cpus[name].append(cpu)

    base = statistics.median(walls["python -c pass (baseline)"])
    print(f"CLI start: {args.reps} repetitions each, interleaved ({sys.executable})")
    for name in runs:
        med = statistics.median(walls[name])
        print(
            f"  {name:38s} wall min {min(walls[name]) * 1000:6.1f} ms  median {med * 1000:6.1f} ms"
            f"  cpu median {statistics.median(cpus[name]) * 1000:6.1f} ms"
            f"  ratio to baseline {med / base:5.2f}"
        )
    if args.against:
        for name in commands:
            new, old = (statistics.median(walls[name + k]) for k in trees)
            print(f"  {name}: this tree : against = {new / old:.2f}")


if __name__ == "__main__":
    main()
