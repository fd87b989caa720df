"""Custody benchmark: what leases and a detached pi (keeper, FIFO, events file) cost a run, and
how long a restarted harness takes to resume a run on its original pi.

One scripted provider (tests/provider.py); a run of N turns, each but the last a ``bash`` tool
call, the last a text answer. ``tether run`` (the CLI, as a user runs it) is timed, interleaved
repetition by repetition, with two configurations that differ only in ``[custody] detached``:

- ``with``: pi under its keeper (commands through the FIFO, events read from the file by
  offset), leases with placement heartbeats;
- ``without``: pi as the harness's child over pipes (the transport before custody), the same
  queue and ledger.

Then the recovery: a ``tether run`` whose tool sleeps is killed with SIGKILL, and ``tether
recover`` is started; the time from its start to the line saying it resumed the run (process
start, ledger, reconcile, attach to the keeper), and to the resumed run's end.

    .venv/bin/python bench/custody.py                 # 20 turns, 5 repetitions
    .venv/bin/python bench/custody.py --turns 20 --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TETHER = [sys.executable, "-m", "tether"]


def write_config(tmp: Path, url: str, *, detached: bool, name: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(
        f"""
[ledger]
url = "sqlite://{tmp}/{name}.db"

[providers.local]
base_url = "{url}"
context_window = 64000
max_tokens = 1024

[agents.rev]
provider = "local"
model = "scripted"
tools = ["bash"]
deadline_s = 300
workdir = "work"

[harness]
runs_dir = "runs-{name}"

[custody]
detached = {"true" if detached else "false"}
lease_s = 30
"""
    )
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def children_cpu() -> float:
    """CPU seconds of reaped children: tether, its keeper and pi (each reaps the next)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def timed_run(tmp: Path, cfg: Path, session: str, text: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (tether, the keeper, pi and its tools) of one run."""
    cpu_before = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [*TETHER, "run", "--config", str(cfg), "-s", session, "-a", "rev", "--json", text],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=env(),
        timeout=600,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"tether run failed ({done.returncode}): {done.stderr[-500:]}")
    return took, children_cpu() - cpu_before


def recovery(tmp: Path, provider_url: str) -> tuple[float, float]:
    """Seconds from starting ``tether recover`` to its resuming the run, and to its end."""
    cfg = write_config(tmp, provider_url, detached=True, name="recover")
    proc = subprocess.Popen(
        [*TETHER, "run", "--config", str(cfg), "-s", "r1", "-a", "rev", "--json", "SLEEP"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp,
        env=env(),
    )
    runs = tmp / "runs-recover"
    deadline = time.monotonic() + 60
    while not list(runs.glob("*/prompt.sent")):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the run to recover did not start")
        time.sleep(0.02)
    time.sleep(0.5)  # inside the sleeping tool
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    started = time.perf_counter()
    rec = subprocess.Popen(
        [*TETHER, "recover", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        env=env(),
    )
    assert rec.stderr is not None
    resumed = None
    for line in rec.stderr:
        if line.startswith("resuming run"):
            resumed = time.perf_counter() - started
            break
    out, err = rec.communicate(timeout=120)
    ended = time.perf_counter() - started
    if resumed is None or "resumed, finished" not in out:
        raise SystemExit(f"recover did not resume the run: {out} {err}")
    return resumed, ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--recoveries", type=int, default=3)
    args = parser.parse_args()

    from provider import Reply, ScriptedProvider, ToolCall

    turns = args.turns

    def script(req: Any) -> Any:
        if req.last_user_text == "SLEEP":
            if req.messages[-1].get("role") == "tool":
                return Reply("woke up")
            return Reply(tool_calls=[ToolCall("bash", {"command": "sleep 2"})])
        done = sum(1 for m in req.messages if m.get("role") == "tool")
        if done >= turns - 1:
            return Reply("the answer")
        return Reply(tool_calls=[ToolCall("bash", {"command": f"echo turn {done}"})])

    with tempfile.TemporaryDirectory() as tmpdir, ScriptedProvider(script) as provider:
        tmp = Path(tmpdir)
        with_cfg = write_config(tmp, provider.url, detached=True, name="with")
        without_cfg = write_config(tmp, provider.url, detached=False, name="without")
        timed_run(tmp, with_cfg, "warm", "warm up")  # node's and python's caches
        timed_run(tmp, without_cfg, "warm", "warm up")
        times: dict[str, list[float]] = {"with": [], "without": []}
        cpu: dict[str, list[float]] = {"with": [], "without": []}
        for rep in range(args.reps):
            order = [("with", with_cfg), ("without", without_cfg)]
            if rep % 2:
                order.reverse()
            for name, cfg in order:
                wall, used = timed_run(tmp, cfg, f"s{rep}", f"go {rep}")
                times[name].append(wall)
                cpu[name].append(used)
        paired = [w / wo for w, wo in zip(times["with"], times["without"], strict=True)]
        print(f"tether run, {turns} turns, {args.reps} repetitions (interleaved)")
        for name in ("without", "with"):
            ts, cs = times[name], cpu[name]
            print(
                f"  {name:8} wall median {statistics.median(ts):.3f}s  min {min(ts):.3f}  "
                f"max {max(ts):.3f}   CPU median {statistics.median(cs):.3f}s"
            )
        med_with, med_without = (
            statistics.median(times["with"]),
            statistics.median(times["without"]),
        )
        print(
            f"  with : without, wall = {med_with / med_without:.3f} (medians), "
            f"{statistics.median(paired):.3f} (median of paired repetitions)"
        )
        cpu_ratio = statistics.median(cpu["with"]) / statistics.median(cpu["without"])
        print(f"  with : without, CPU  = {cpu_ratio:.3f} (medians)")

        resumed, ended = [], []
        for i in range(args.recoveries):
            sub = tmp / f"rec{i}"
            sub.mkdir()
            r, e = recovery(sub, provider.url)
            resumed.append(r)
            ended.append(e)
        print(f"harness restart → resumed run ({args.recoveries} recoveries, `tether recover`)")
        print(
            f"  to 'resuming run': median {statistics.median(resumed):.3f}s  "
            f"(min {min(resumed):.3f}, max {max(resumed):.3f})"
        )
        print(
            f"  to the resumed run's end (the tool's 2 s sleep included): median "
            f"{statistics.median(ended):.3f}s"
        )
        print(json.dumps({"wall": times, "cpu": cpu}))


if __name__ == "__main__":
    main()
