"""Service benchmark: the platform over HTTP against driving pi directly.

``--sessions`` sessions × ``--requests`` requests are posted to ``tether serve --workers N``
(a subprocess, real uvicorn on 127.0.0.1, SQLite by default or ``--ledger postgresql://…``), and
the same number of prompts is driven straight into pi over its RPC (the baseline: start pi with
the same argv and agent dir, ``prompt``, read until ``agent_settled``, close), ``--workers`` at a
time. The scripted provider (tests/provider.py) answers every request at once (plus
``--latency-ms``). The load of a shared machine drifts, so the two alternate by round: one
request on every session through the service, then as many prompts straight into pi.

Printed: the serve process's own CPU per run (user + system, not its children: pi and its
keeper); the whole machine's CPU per run for each way (/proc/stat over that way's rounds: pi,
its keeper, its sandbox and the bench's own provider included), whose ratio is where the
throughput ratio must be when every CPU is busy; throughput (runs per second, whole batch,
each way) and its ratio; per run, the wall time of the run (service: the run's ``started`` →
``ended`` in the ledger, i.e. claim, view, request row, pi under its keeper, mirror, checkpoint
step, end; baseline: pi's start → exit) at p50 and p99 and the overhead as a ratio against the
baseline; the latency of ``POST …/requests`` (p50/p99).

``--against PATH`` serves a second service from another checkout (PATH or PATH/src holding
``tether``; e.g. ``git worktree add /tmp/base main``), on a ledger of its own, in the same rounds
(the order rotates by round), so before and after are one run on one machine's load. Every
checkout runs this checkout's pi (``TETHER_PI``, ``TETHER_NODE``): it needs no node_modules.
Each service (and ``--cli``) keeps Node's compile cache apart (``XDG_CACHE_HOME`` in its work
directory), as on a host whose runs are all sandboxed: only its own warm-up fills it, not the
baseline's pi, which writes the user's.
The bench's one actor gets ``[service.limits]`` it never reaches (a checkout that has them: so
they are counted with every request, as always, but refuse none); ``--budgets`` gives it a
``[service.budgets]`` it never reaches too, so that every run writes its usage after each
provider call and reads its actor's day (the most usage accounting costs a run).
``--cli`` times ``tether run`` in the same rounds too (its ledger's ``started`` comes after pi
was started, so its per-run figure is not the service's). ``--unconfined`` runs the agent with
``sandbox = "none"``, to see what confinement costs a run. The service's own timing of
``POST …/requests`` (its /metrics histogram) is printed beside the client's.
``--loop-stalls MS`` records, in each serve process, every event-loop callback and every garbage
collection that took longer than MS (``bench/loopstalls/``), and prints those of its rounds: how
many callbacks, how many of them spent under a quarter of their wall time on the CPU (the event
loop's thread was waiting for a CPU or the GIL, not working), the collections, and the awaits
that the longest callbacks stopped at.

``--rss-runs N`` measures memory instead: requests go to the service (``--sessions`` sessions,
one queued request each at a time) until N runs ended; the serve process's resident set size
is sampled every 100 runs and the ratio of run N's to run 100's printed (flat: within ±10 %).

    .venv/bin/python bench/service.py                        # 50 sessions × 3, 4 workers
    .venv/bin/python bench/service.py --sessions 10 --requests 2 --workers 2
    .venv/bin/python bench/service.py --baseline-extension   # the baseline's pi loads the
                                                              # continuation extension too
    .venv/bin/python bench/service.py --baseline-extension --against /tmp/base
    .venv/bin/python bench/service.py --loop-stalls 4        # the event loop's long callbacks
    .venv/bin/python bench/service.py --rss-runs 1000        # RSS at run 100 and run 1,000
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
import psutil  # noqa: E402

from provider import RecordedRequest, Reply, ScriptedProvider  # noqa: E402
from tether.config import load_config  # noqa: E402
from tether.harness import EXTENSION_PATH  # noqa: E402
from tether.ledger import Ledger, RunStatus, open_ledger  # noqa: E402
from tether.pi.agentdir import write_agent_dir  # noqa: E402
from tether.pi.install import PiInstall, find_pi, pi_argv, pi_env  # noqa: E402

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


def machine_cpu() -> tuple[float, float]:
    """The whole machine's busy and idle CPU seconds so far (/proc/stat): what every process
    spent, pi, its keeper and sandbox included, which no one process's rusage can show."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / tick, (idle + iowait) / tick


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONFIG = """
[ledger]
url = "{ledger}"
[providers.local]
base_url = "{provider}"
context_window = 1000000
max_tokens = 1024
[agents.bench]
provider = "local"
model = "scripted"
deadline_s = 600
workdir = "{tree}"
{sandbox}
[harness]
runs_dir = "runs"
[service]
poll_s = 0.05
{limits}
[service.tokens]
"{digest}" = "user:bench"
"""

LIMITS = """
[service.limits]
queued = 1000000
live = 1000000
per_minute = 1000000
"""
"""The bench's one actor's limits, for a checkout that has them: counted with every request, as
they always are, and never reached (the defaults, 20 queued and 60 a minute, would be)."""
BUDGETS = """
[service.budgets]
tokens_per_day = 1000000000000
"""
"""``--budgets``: a budget (for a checkout that has them) never reached, so that every run also
writes its usage after each provider call and reads its actor's day (tether.harness.usage)."""


def limits_for(src: Path, budgets: bool) -> str:
    """What a checkout's configuration can say of limits and budgets (an older one has neither:
    an unknown key is an error)."""
    config = (src / "tether" / "config.py").read_text()
    found = LIMITS if "class ServiceLimits" in config else ""
    if budgets and "class ServiceBudgets" in config:
        found += BUDGETS
    return found


def source_dir(path: str) -> Path:
    """The directory holding the ``tether`` package of a checkout (PATH/src or PATH)."""
    for candidate in (Path(path) / "src", Path(path)):
        if (candidate / "tether" / "__init__.py").is_file():
            return candidate.resolve()
    raise SystemExit(f"--against {path}: no tether package in {path}/src or {path}")


@dataclass
class Service:
    """One ``tether serve --workers N`` on a ledger of its own, and what was measured on it."""

    name: str
    src: Path
    work: Path
    ledger_url: str
    process: subprocess.Popen[bytes] | None = None
    client: httpx.Client | None = None
    store: Ledger | None = None
    posts: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    rounds: list[tuple[float, float]] = field(default_factory=list)
    """Each round's start and end (epoch seconds), to pick its event loop's stalls."""
    loop_stalls_ms: float | None = None
    wall: float = 0.0
    cpu: float = 0.0
    """CPU seconds the serve process itself spent (user + system) during the rounds."""

    def start(self, cfg_path: Path, workers: int, pi: PiInstall) -> None:
        port = free_port()
        log = (self.work / "serve.log").open("wb")
        probe: dict[str, str] = {}
        if self.loop_stalls_ms is not None:
            probe = {
                "PYTHONPATH": f"{self.src}{os.pathsep}{ROOT / 'bench' / 'loopstalls'}",
                "TETHER_BENCH_LOOP_STALLS": f"{self.loop_stalls_ms}:{self.stalls_file}",
            }
        self.process = subprocess.Popen(
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
                str(workers),
            ],
            cwd=self.work,
            stdout=log,
            stderr=subprocess.STDOUT,
            # The same pi for every checkout (another one may have no node_modules of its own).
            # Node's compile cache of its own, as on a host whose runs are all sandboxed: only
            # the service's warm-up fills it (a sandboxed pi may not), not the direct runs.
            env={
                **os.environ,
                "PYTHONPATH": str(self.src),
                "TETHER_PI": str(pi.cli),
                "TETHER_NODE": str(pi.node),
                "XDG_CACHE_HOME": str(self.work / "cache"),
                **probe,
            },
        )
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"tether serve did not start: {self.work / 'serve.log'}")
            time.sleep(0.05)
        if not self.ledger_url.startswith("sqlite://"):
            self.store = open_ledger(self.ledger_url)

    def _runs(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of the service's SQLite ledger's ``runs`` table, read without tether: opening it
        with this checkout's ledger would migrate a ledger that another checkout's service owns
        (``--against``), under that service."""
        path = self.ledger_url.removeprefix("sqlite://")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def post(self, session: str, text: str, request_id: str) -> str:
        assert self.client is not None
        t = time.perf_counter()
        r = self.client.post(
            f"/v1/sessions/{session}/requests",
            json={"agent": "bench", "text": text, "request_id": request_id},
        )
        self.posts.append(time.perf_counter() - t)
        r.raise_for_status()
        run = str(r.json()["run"])
        self.runs.append(run)
        return run

    def pending(self) -> int:
        if self.store is None:
            sql = "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
            return int(self._runs(sql)[0][0])
        counts = self.store.run_counts()
        return counts[RunStatus.QUEUED] + counts[RunStatus.RUNNING]

    def rss(self) -> int:
        assert self.process is not None
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def round(self, sessions: int, n: int) -> float:
        """One request on every session; seconds until all of them ended."""
        assert self.process is not None
        proc = psutil.Process(self.process.pid)
        cpu = sum(proc.cpu_times()[:2])
        started, since = time.perf_counter(), time.time()
        for s in range(sessions):
            self.post(f"b{s}", f"request {n}", f"{s}-{n}")
        while self.pending():
            time.sleep(0.05)
        took = time.perf_counter() - started
        self.rounds.append((since, time.time()))
        self.wall += took
        self.cpu += sum(proc.cpu_times()[:2]) - cpu
        return took

    @property
    def stalls_file(self) -> Path:
        return self.work / "loop-stalls.tsv"

    def stalls(self) -> list[str]:
        """What ``--loop-stalls`` recorded in this service's rounds, as lines to print."""
        rows, collections = [], []
        for line in self.stalls_file.read_text().splitlines():
            at, wall, cpu, where = line.split("\t", 3)
            if any(start <= float(at) <= end for start, end in self.rounds):
                kept = collections if where.startswith("gc: ") else rows
                kept.append((float(wall), float(cpu), where))
        limit = f"{self.loop_stalls_ms:g} ms"
        if not rows:
            return [f"event loop: no callback over {limit} in its rounds"]
        waiting = [r for r in rows if r[1] < r[0] / 4]
        out = [
            f"event loop: {len(rows)} callbacks over {limit} in its rounds, "
            f"{sum(r[0] for r in rows):.0f} ms of wall time and {sum(r[1] for r in rows):.0f} "
            f"ms of CPU in all; {len(waiting)} of them ({len(waiting) / len(rows):.0%}) on the "
            "CPU for under a quarter of their wall time (waiting for a CPU or the GIL)",
            f"  garbage collections over {limit} (inside those callbacks or a worker thread): "
            f"{len(collections)}, "
            + ", ".join(f"{wall:.0f} ms ({where[4:]})" for wall, _, where in collections[:6]),
            "  the longest callbacks (wall ms, CPU ms, the await its step stopped at):",
        ]
        for took, used, site in sorted(rows, reverse=True)[:5]:
            out.append(f"  {took:7.1f} {used:7.1f}  {site}")
        return out

    def server_post_p(self, q: float) -> str:
        """The service's own view of ``POST …/requests`` (its /metrics histogram, so without
        this process's share): the bucket bound that ``q`` of them stayed within."""
        assert self.client is not None
        route = 'method="POST",route="/v1/sessions/{session}/requests"'
        buckets: list[tuple[str, int]] = []
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith("tether_http_request_seconds_bucket{") and route in line:
                bound = line.split('le="')[1].split('"')[0]
                buckets.append((bound, int(line.rsplit(" ", 1)[1])))
        if not buckets:
            return "?"
        total = buckets[-1][1]
        bound = next(b for b, n in buckets if n >= q * total)
        return f"≤ {float(bound) * 1000:.0f} ms" if bound != "+Inf" else "> 10 s"

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.store is not None:
            self.store.close()
        if self.process is not None:
            self.process.terminate()
            self.process.wait(60)

    def durations(self) -> list[float]:
        """Each run's ``started`` → ``ended``; exits when a run did not finish."""
        if self.store is None:
            sql = "SELECT id, status, started, ended, extra FROM runs WHERE id = ?"
            found = [self._runs(sql, (r,))[0] for r in self.runs]
            details = [(i, st, s0, s1, json.loads(x)) for i, st, s0, s1, x in found]
        else:
            runs = [self.store.get_run(r) for r in self.runs]
            details = [(r.id, r.status.value, r.started, r.ended, r.extra) for r in runs]
        bad = [(i, st, x.get("error")) for i, st, _, _, x in details if st != "finished"]
        if bad:
            raise SystemExit(f"{self.name}: {len(bad)} runs did not finish: {bad[:3]}")
        return [seconds(s1) - seconds(s0) for _, _, s0, s1, _ in details if s0 and s1]


def rss_runs(service: Service, sessions: int, runs: int) -> None:
    """Requests until ``runs`` ended, one queued at a time per session; RSS every 100 runs."""
    assert service.store is not None
    samples: dict[int, int] = {}
    posted = 0
    per_session = [0] * sessions
    started = time.perf_counter()
    next_sample = 100
    while True:
        counts = service.store.run_counts()
        ended = posted - counts[RunStatus.QUEUED] - counts[RunStatus.RUNNING]
        while ended >= next_sample and next_sample <= runs:
            samples[next_sample] = service.rss()
            print(
                f"{service.name}: run {next_sample}: RSS {samples[next_sample] / 2**20:.1f} MiB "
                f"({time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            next_sample += 100
        if ended >= runs:
            break
        # Keep one request queued or running on every session while runs remain to post.
        if counts[RunStatus.QUEUED] == 0 and posted < runs:
            for s in range(min(sessions, runs - posted)):
                service.post(f"m{s}", f"request {per_session[s]}", f"m{s}-{per_session[s]}")
                per_session[s] += 1
                posted += 1
        time.sleep(0.05)
    first, last = samples[100], samples[max(samples)]
    print(
        f"{service.name}: RSS run 100 {first / 2**20:.1f} MiB, run {max(samples)} "
        f"{last / 2**20:.1f} MiB: ratio {last / first:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--ledger", default=None, help="ledger URL (default: SQLite in a tmp dir)")
    parser.add_argument(
        "--budgets",
        action="store_true",
        help="give the bench's actor a [service.budgets] it never reaches (a checkout that has "
        "them): each run then writes its usage as it goes",
    )
    parser.add_argument(
        "--baseline-extension",
        action="store_true",
        help="load tether's continuation extension in the baseline's pi too (as the service's)",
    )
    parser.add_argument(
        "--against",
        metavar="PATH",
        help="also serve from another checkout (PATH/src), on its own SQLite ledger, same rounds",
    )
    parser.add_argument(
        "--tree",
        metavar="PATH",
        help="serve the first service from another checkout too (PATH/src; default this one): "
        "with --against, two older checkouts compared by this bench",
    )
    parser.add_argument(
        "--unconfined",
        action="store_true",
        help='run the agent with sandbox = "none" (default: its sandbox, bubblewrap), to see '
        "what confinement costs a run (the baseline's pi is never confined)",
    )
    parser.add_argument(
        "--cli",
        action="store_true",
        help="also run the same requests with `tether run` (one process per run), same rounds",
    )
    parser.add_argument(
        "--loop-stalls",
        type=float,
        metavar="MS",
        help="record each serve process's event-loop callbacks over MS ms and summarize them",
    )
    parser.add_argument(
        "--rss-runs",
        type=int,
        metavar="N",
        help="measure the serve process's RSS from run 100 to run N instead (N ≥ 100)",
    )
    args = parser.parse_args()
    if args.rss_runs is not None and args.rss_runs < 100:
        parser.error("--rss-runs needs at least 100 runs (RSS is compared to run 100's)")
    if args.against and args.ledger:
        parser.error("--against serves each checkout on a SQLite ledger of its own: no --ledger")
    total = args.sessions * args.requests
    delay = args.latency_ms / 1000

    def reply(req: RecordedRequest) -> Reply:
        return Reply(f"answer to {req.last_user_text}", delay_s=delay)

    work = Path(tempfile.mkdtemp(prefix="tether-bench-service-"))
    pi = find_pi()
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    sandbox = 'sandbox = "none"' if args.unconfined else ""
    (work / "tree").mkdir()
    with ScriptedProvider(reply) as provider:
        services: list[Service] = []
        main_src = source_dir(args.tree) if args.tree else ROOT / "src"
        for name, src in (("service", main_src), ("against", None)):
            if name == "against":
                if not args.against:
                    continue
                src = source_dir(args.against)
            assert src is not None
            home = work / name
            home.mkdir()
            url = args.ledger or f"sqlite://{home}/ledger.db"
            (home / "tether.toml").write_text(
                CONFIG.format(
                    ledger=url,
                    provider=provider.url,
                    tree=work / "tree",
                    digest=digest,
                    sandbox=sandbox,
                    limits=limits_for(src, args.budgets),
                )
            )
            services.append(Service(name, src, home, url, loop_stalls_ms=args.loop_stalls))
        cfg = load_config(services[0].work / "tether.toml")
        agent = cfg.agent("bench")

        if args.rss_runs is not None:
            print(
                f"RSS over {args.rss_runs} runs ({args.sessions} sessions, {args.workers} "
                f"workers); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
            )
            for service in services:
                try:
                    service.start(service.work / "tether.toml", args.workers, pi)
                    rss_runs(service, args.sessions, args.rss_runs)
                finally:
                    service.stop()
            print(f"(work dir {work})")
            return

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
        direct_both: list[tuple[float, float]] = []
        direct_walls: list[float] = []

        def direct_round(n: int) -> float:
            times, wall = baseline(f"{n}", args.sessions)
            direct_both.extend(times)
            direct_walls.append(wall)
            return wall

        def served_round(service: Service, n: int) -> float:
            return service.round(args.sessions, n)

        cli_home = work / "cli"
        cli_runs: list[float] = []
        cli_walls: list[float] = []
        if args.cli:
            cli_home.mkdir()
            (cli_home / "tether.toml").write_text(
                CONFIG.format(
                    ledger=f"sqlite://{cli_home}/ledger.db",
                    provider=provider.url,
                    tree=work / "tree",
                    digest=digest,
                    sandbox=sandbox,
                    limits="",  # tether run is not limited
                )
            )

        def cli_round(n: int) -> float:
            """``tether run`` on every session, ``--workers`` at a time."""

            def one(s: int) -> float:
                t = time.perf_counter()
                argv = [sys.executable, "-m", "tether", "run", "-c", str(cli_home / "tether.toml")]
                done = subprocess.run(
                    [*argv, "-s", f"b{s}", "-a", "bench", "--json", f"request {n}"],
                    cwd=cli_home,
                    capture_output=True,
                    env={
                        **os.environ,
                        "PYTHONPATH": str(ROOT / "src"),
                        "TETHER_PI": str(pi.cli),
                        "TETHER_NODE": str(pi.node),
                        "XDG_CACHE_HOME": str(cli_home / "cache"),
                    },
                )
                if done.returncode != 0:
                    raise SystemExit(f"tether run failed ({done.returncode}): {done.stderr!r}")
                return time.perf_counter() - t

            started = time.perf_counter()
            with ThreadPoolExecutor(args.workers) as pool:
                cli_runs.extend(pool.map(one, range(args.sessions)))
            wall = time.perf_counter() - started
            cli_walls.append(wall)
            return wall

        # Per way: the machine's busy and idle CPU seconds over its rounds.
        machine: dict[str, list[float]] = {
            name: [0.0, 0.0] for name in ("direct", "cli", *(s.name for s in services))
        }
        try:
            for service in services:
                service.start(service.work / "tether.toml", args.workers, pi)
            # Interleaved by round (the load of a shared machine drifts): one request on every
            # session through each service, then as many prompts straight into pi; which goes
            # first rotates by round, so a drifting load favours none.
            for n in range(args.requests):
                steps: list[tuple[str, Callable[[int], float]]] = [
                    ("direct", direct_round),
                    *((("cli", cli_round),) if args.cli else ()),
                    *((s.name, functools.partial(served_round, s)) for s in services),
                ]
                shift = n % len(steps)
                took = []
                for name, step in steps[shift:] + steps[:shift]:
                    before = machine_cpu()
                    took.append((name, step(n)))
                    after = machine_cpu()
                    spent = machine[name]
                    spent[0] += after[0] - before[0]
                    spent[1] += after[1] - before[1]
                shown = ", ".join(f"{name} {wall:.1f}s" for name, wall in took)
                print(f"round {n + 1}: {shown}, load {os.getloadavg()[0]:.1f}", flush=True)
            measured = [(s, s.durations()) for s in services]
            server_posts = {s.name: (s.server_post_p(0.5), s.server_post_p(0.99)) for s in services}
            if args.cli:
                with open_ledger(f"sqlite://{cli_home}/ledger.db") as cli_store:
                    cli_ran = [
                        seconds(r.ended) - seconds(r.started)
                        for s in range(args.sessions)
                        for r in cli_store.runs(f"b{s}")
                        if r.ended and r.started
                    ]
        finally:
            for service in services:
                service.stop()
    direct = [exited for _, exited in direct_both]
    to_settle = [settled for settled, _ in direct_both]
    tp_direct = total / sum(direct_walls)
    print()
    print(
        f"direct, start → agent_settled only: p50 {pct(to_settle, 0.5) * 1000:.0f} ms, "
        f"p99 {pct(to_settle, 0.99) * 1000:.0f} ms"
    )

    def cpu_line(name: str) -> str:
        busy, idle = machine[name]
        return f"{busy / total * 1000:.0f} ms a run, busy {busy / (busy + idle):.0%}"

    # On a machine whose CPUs are all busy, runs per second is CPU per run turned over: so
    # direct's machine CPU per run over a way's is where that way's throughput ratio must be.
    print(f"machine CPU (all processes, /proc/stat), direct: {cpu_line('direct')}")
    for service, times in measured:
        tp = total / service.wall
        print(f"-- {service.name} ({service.src})")
        print(
            f"throughput   direct {tp_direct:.2f} runs/s   {service.name} {tp:.2f} runs/s   "
            f"ratio {tp / tp_direct:.3f}"
        )
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            d, s = pct(direct, q), pct(times, q)
            print(
                f"per run {name}  direct {d * 1000:.0f} ms   {service.name} {s * 1000:.0f} ms   "
                f"overhead {s / d - 1:+.1%}"
            )
        print(
            f"mean         direct {statistics.mean(direct) * 1000:.0f} ms   "
            f"{service.name} {statistics.mean(times) * 1000:.0f} ms   "
            f"overhead {statistics.mean(times) / statistics.mean(direct) - 1:+.1%}"
        )
        print(
            f"POST /requests  p50 {pct(service.posts, 0.5) * 1000:.1f} ms   "
            f"p99 {pct(service.posts, 0.99) * 1000:.1f} ms"
        )
        p50, p99 = server_posts[service.name]
        print(f"POST /requests, as the service timed it (its /metrics): p50 {p50}   p99 {p99}")
        print(f"serve process CPU per run (its own, not pi's): {service.cpu / total * 1000:.0f} ms")
        if args.loop_stalls is not None:
            print("\n".join(service.stalls()))
        ratio = machine["direct"][0] / machine[service.name][0]
        print(
            f"machine CPU (all processes), {service.name}: {cpu_line(service.name)}; direct's "
            f"CPU per run : {service.name}'s = {ratio:.3f} (the throughput ratio when all "
            "CPUs are busy)"
        )
    if args.cli:
        tp = total / sum(cli_walls)
        print("-- tether run (one process per run)")
        print(f"machine CPU (all processes), cli: {cpu_line('cli')}")
        print(
            f"throughput   direct {tp_direct:.2f} runs/s   cli {tp:.2f} runs/s   "
            f"ratio {tp / tp_direct:.3f}"
        )
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            d, c, w = pct(direct, q), pct(cli_ran, q), pct(cli_runs, q)
            print(
                f"per run {name}  direct {d * 1000:.0f} ms   cli {c * 1000:.0f} ms   "
                f"overhead {c / d - 1:+.1%}   (the process, start to exit: {w * 1000:.0f} ms)"
            )
    print(f"(work dir {work})")


if __name__ == "__main__":
    main()
