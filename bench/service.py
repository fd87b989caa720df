"""Service benchmark: the platform over HTTP against driving pi directly.

``--sessions`` sessions × ``--requests`` requests are posted to ``tether serve --workers N``
(a subprocess, real uvicorn on 127.0.0.1, SQLite by default or ``--ledger postgresql://…``), and
the same number of prompts is driven straight into pi over its RPC (the baseline: start pi with
the same argv and agent dir, ``prompt``, read until ``agent_settled``, close), ``--workers`` at a
time. The scripted provider (tests/provider.py) answers every request at once (plus
``--latency-ms``). The load of a shared machine drifts, so the two alternate by round: one
request on every session through the service, then as many prompts straight into pi.

Printed: throughput (runs per second, whole batch, each way) and its ratio; per run, the wall
time of the run (service: the run's ``started`` → ``ended`` in the ledger, i.e. claim, view,
request row, pi under its keeper, mirror, checkpoint step, end; baseline: pi's start → exit)
at p50 and p99 and the overhead as a ratio against the baseline; the latency of ``POST
…/requests`` (p50/p99).

    .venv/bin/python bench/service.py                        # 50 sessions × 3, 4 workers
    .venv/bin/python bench/service.py --sessions 10 --requests 2 --workers 2
    .venv/bin/python bench/service.py --baseline-extension   # the baseline's pi loads the
                                                              # continuation extension too
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

from provider import RecordedRequest, Reply, ScriptedProvider  # noqa: E402
from tether.config import load_config  # noqa: E402
from tether.harness import EXTENSION_PATH  # noqa: E402
from tether.ledger import RunStatus, open_ledger  # noqa: E402
from tether.pi.agentdir import write_agent_dir  # noqa: E402
from tether.pi.install import find_pi, pi_argv, pi_env  # noqa: E402

TOKEN = "bench-token"


def direct_rpc(
    argv: list[str], env: dict[str, str], cwd: str, prompt: str, log: str
) -> tuple[float, float]:
    """The baseline client: start pi, prompt, read until settled, close. Wall seconds to
    ``agent_settled`` and to pi's exit."""
    started = time.perf_counter()
    with open(log, "wb") as err:
        # A session of its own, as tether starts pi: with the scheduler's autogroups on, a
        # process shares the CPU with its session, so the baseline must not share one.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(json.dumps({"id": "1", "type": "prompt", "message": prompt}).encode() + b"\n")
    proc.stdin.flush()
    settled = False
    for line in proc.stdout:
        if json.loads(line).get("type") == "agent_settled":
            settled = True
            break
    settled_s = time.perf_counter() - started
    proc.stdin.close()
    proc.wait()
    if not settled:
        raise SystemExit(
            f"direct RPC: pi ended without agent_settled (exit {proc.returncode}); {log}"
        )
    return settled_s, time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--ledger", default=None, help="ledger URL (default: SQLite in a tmp dir)")
    parser.add_argument(
        "--baseline-extension",
        action="store_true",
        help="load tether's continuation extension in the baseline's pi too (as the service's)",
    )
    args = parser.parse_args()
    total = args.sessions * args.requests
    delay = args.latency_ms / 1000

    def reply(req: RecordedRequest) -> Reply:
        return Reply(f"answer to {req.last_user_text}", delay_s=delay)

    work = Path(tempfile.mkdtemp(prefix="tether-bench-service-"))
    ledger_url = args.ledger or f"sqlite://{work}/ledger.db"
    pi = find_pi()
    with ScriptedProvider(reply) as provider:
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        cfg_path = work / "tether.toml"
        cfg_path.write_text(
            f"""
[ledger]
url = "{ledger_url}"
[providers.local]
base_url = "{provider.url}"
context_window = 1000000
max_tokens = 1024
[agents.bench]
provider = "local"
model = "scripted"
deadline_s = 600
workdir = "tree"
[harness]
runs_dir = "runs"
[service]
poll_s = 0.05
[service.tokens]
"{digest}" = "user:bench"
"""
        )
        cfg = load_config(cfg_path)
        agent = cfg.agent("bench")
        (work / "tree").mkdir()

        def baseline(label: str, count: int) -> tuple[list[tuple[float, float]], float]:
            specs = []
            for i in range(count):
                run_dir = work / "direct" / f"{label}-{i}"
                agent_dir = write_agent_dir(run_dir / "agent", cfg, "bench")
                (run_dir / "tmp").mkdir()
                argv = pi_argv(
                    pi,
                    session_file=run_dir / "session.jsonl",
                    provider=agent.provider,
                    model=agent.model,
                    effort=agent.effort,
                    tools=agent.tools,
                    system_prompt=agent.system_prompt,
                    extensions=(EXTENSION_PATH,) if args.baseline_extension else (),
                )
                specs.append(
                    (
                        argv,
                        pi_env(agent_dir.env, pi, tmpdir=run_dir / "tmp"),
                        str(work / "tree"),
                        f"request {i}",
                        str(run_dir / "pi.log"),
                    )
                )
            started = time.perf_counter()
            with ThreadPoolExecutor(args.workers) as pool:
                times = list(pool.map(lambda s: direct_rpc(*s), specs))
            return times, time.perf_counter() - started

        print(
            f"{total} runs ({args.sessions} sessions × {args.requests}), {args.workers} at a "
            f"time; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        port = free_port()
        log = (work / "serve.log").open("wb")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tether",
                "serve",
                "--config",
                str(cfg_path),
                "--port",
                str(port),
                "--workers",
                str(args.workers),
            ],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        posts: list[float] = []
        runs: list[str] = []
        direct_both: list[tuple[float, float]] = []
        direct_wall = service_wall = 0.0
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"tether serve did not start: {work / 'serve.log'}")
                time.sleep(0.05)
            store = open_ledger(ledger_url)
            # Interleaved by round (the load of a shared machine drifts): one request on every
            # session through the service, then as many prompts straight into pi.
            for n in range(args.requests):

                def through_service(n: int = n) -> float:
                    started = time.perf_counter()
                    for s in range(args.sessions):
                        t = time.perf_counter()
                        r = client.post(
                            f"/v1/sessions/b{s}/requests",
                            json={
                                "agent": "bench",
                                "text": f"request {n}",
                                "request_id": f"{s}-{n}",
                            },
                        )
                        posts.append(time.perf_counter() - t)
                        r.raise_for_status()
                        runs.append(r.json()["run"])
                    while True:
                        counts = store.run_counts()
                        if counts[RunStatus.QUEUED] == 0 and counts[RunStatus.RUNNING] == 0:
                            break
                        time.sleep(0.05)
                    return time.perf_counter() - started

                # Which goes first alternates by round, so a drifting load favours neither.
                if n % 2 == 0:
                    took = through_service()
                    times, wall = baseline(f"{n}", args.sessions)
                else:
                    times, wall = baseline(f"{n}", args.sessions)
                    took = through_service()
                service_wall += took
                direct_both += times
                direct_wall += wall
                print(
                    f"round {n + 1}: service {took:.1f}s, direct {wall:.1f}s, "
                    f"load {os.getloadavg()[0]:.1f}"
                )
            details = [store.get_run(r) for r in runs]
            store.close()
        finally:
            client.close()
            server.terminate()
            server.wait(60)
    bad = [
        (r.id, r.status.value, r.extra.get("error"))
        for r in details
        if r.status is not RunStatus.FINISHED
    ]
    if bad:
        raise SystemExit(f"{len(bad)} runs did not finish: {bad[:3]}")
    service = [seconds(r.ended) - seconds(r.started) for r in details if r.ended and r.started]
    direct = [exited for _, exited in direct_both]
    to_settle = [settled for settled, _ in direct_both]
    tp_direct, tp_service = total / direct_wall, total / service_wall
    print()
    print(
        f"throughput   direct {tp_direct:.2f} runs/s   service {tp_service:.2f} runs/s   "
        f"ratio {tp_service / tp_direct:.3f}"
    )
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        d, s = pct(direct, q), pct(service, q)
        print(
            f"per run {name}  direct {d * 1000:.0f} ms   service {s * 1000:.0f} ms   "
            f"overhead {s / d - 1:+.1%}"
        )
    print(
        f"direct, start → agent_settled only: p50 {pct(to_settle, 0.5) * 1000:.0f} ms, "
        f"p99 {pct(to_settle, 0.99) * 1000:.0f} ms"
    )
    print(
        f"mean         direct {statistics.mean(direct) * 1000:.0f} ms   "
        f"service {statistics.mean(service) * 1000:.0f} ms   "
        f"overhead {statistics.mean(service) / statistics.mean(direct) - 1:+.1%}"
    )
    print(
        f"POST /requests  p50 {pct(posts, 0.5) * 1000:.1f} ms   "
        f"p99 {pct(posts, 0.99) * 1000:.1f} ms"
    )
    print(f"(work dir {work})")


if __name__ == "__main__":
    main()
