"""Harness benchmark: what tether adds on top of driving pi's RPC directly.

One scripted provider (tests/provider.py) and one script: a run of N turns, each but the last a
tool call (``bash`` and ``read`` alternating), the last a text answer. The same run is timed,
interleaved, repetition by repetition:

- ``direct RPC``: a Python process that starts pi (the argv and agent dir contents tether gives
  it, without tether's extensions), sends the prompt and reads stdout until ``agent_settled``: the
  baseline;
- ``direct RPC + tether's extensions``: the same, with pi loading tether's three extensions (keys,
  continuation, tools) and the recall and note tools, as in a run: pi's own share of the gap;
- ``tether run``: the CLI, as a user runs it (config, ledger, follow-up view, mirror, pi in its
  sandbox), and the same with ``sandbox = "none"``: the sandbox's cost per run;
- in process, ``execute_run`` against the same direct RPC driver run in process.
- with ``--otel``, ``tether run`` and ``execute_run`` again, traced (docs/operations.md#traces):
spans sent
  over OTLP/HTTP to a sink on 127.0.0.1 in a process of its own; ``execute_run``'s traced runs
  share one tracer provider, as a service's do; printed as tracing on : off, paired.

Each repetition times the ways back to back, so the median of the per-repetition ratios is
printed beside the ratio of medians (it drifts less with the load of a shared machine).
Wall time on a shared machine is noisy, so the CPU this process spends per run (direct vs
``execute_run``, the provider's threads counted in both) is printed too. Then the mirror's lag:
for every row, the time from pi creating the entry (its own timestamp) to the row being committed
to the ledger, over all in-process runs: median and p99. Last, the provider forwarder (which a
sandboxed run's provider calls pass through): a streamed reply timed direct and through it.

Each way of ``tether run`` keeps Node's compile cache apart (``XDG_CACHE_HOME``), as on a
host whose runs are all sandboxed: a sandboxed run's cache is filled by tether's warm-up only,
not by the direct runs' pi, which writes the user's (``execute_run`` in process shares that).

The CLI runs as installed, its bytecode compiled once (into a scratch ``PYTHONPYCACHEPREFIX``,
one untimed run of each tree) rather than at every start, as this workplace's
``PYTHONDONTWRITEBYTECODE`` would have it (``--compile-each-start`` keeps that).

    .venv/bin/python bench/harness.py                 # 20 turns, 5 repetitions
    .venv/bin/python bench/harness.py --turns 50 --reps 3 --latency-ms 50
    .venv/bin/python bench/harness.py --otel          # and tracing on : off
    .venv/bin/python bench/harness.py --against /tmp/base/src   # and main's `tether run`
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def direct_rpc(argv: list[str], env: dict[str, str], cwd: str, prompt: str) -> float:
    """The baseline client: prompt, read until settled, close. Returns wall seconds."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(json.dumps({"id": "1", "type": "prompt", "message": prompt}).encode() + b"\n")
    proc.stdin.flush()
    settled = False
    for line in proc.stdout:
        if json.loads(line).get("type") == "agent_settled":
            settled = True
            break
    proc.stdin.close()
    proc.wait()
    if not settled:
        raise SystemExit("direct RPC: pi ended without agent_settled")
    return time.perf_counter() - started


def tool_call_ms(store: Any, sessions: list[str], *, first: bool = False) -> list[float]:
    """Each tool call's time in these sessions: from the assistant message that makes it to
    its result, by pi's own timestamps (ms); ``first``: each run's first call only."""
    out: list[float] = []
    for session in sessions:
        made: float | None = None
        calls: list[float] = []
        for row in store.iter_rows(session):
            stamp = row.body.get("timestamp") if isinstance(row.body, dict) else None
            if not isinstance(stamp, int | float):
                continue
            if row.role == "assistant":
                made = stamp
            elif row.role == "toolResult" and made is not None:
                calls.append(stamp - made)
        out += calls[:1] if first else calls
    return out


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _streamed_reply(connect: Any, host: str) -> float:
    """One streamed chat completion over a fresh connection, read to its end: wall seconds."""
    body = json.dumps(
        {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    with connect() as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if b"[DONE]" not in data:
        raise SystemExit(f"a streamed reply did not end: {data[-300:]!r}")
    return time.perf_counter() - started


def forwarder_latency(url: str, work: Path, replies: int) -> list[float]:
    """What the provider forwarder (tether/sandbox/outside.py, run as in a sandboxed run with a
    placeholder command) adds to one streamed reply: the same reply timed direct and through
    its Unix socket, back to back."""
    import socket

    from tether.sandbox.bwrap import OUTSIDE_SCRIPT, split_base_url

    origin, base_path = split_base_url(url)
    host, port = origin.split("://")[1].rsplit(":", 1)
    path = work / "provider.sock"
    argv = [sys.executable, "-I", "-S", str(OUTSIDE_SCRIPT), "--socket", str(path)]
    argv += ["--api", "openai-completions", "--base-path", base_path]
    forwarder = subprocess.Popen(
        [*argv, "--upstream", origin, "--", "/bin/sleep", "3600"], start_new_session=True
    )
    try:
        while not path.exists():
            time.sleep(0.01)

        def unix() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            return sock

        def tcp() -> socket.socket:
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

        added = []
        for _ in range(replies):
            direct = _streamed_reply(tcp, f"{host}:{port}")
            added.append(_streamed_reply(unix, "x") - direct)
        return added
    finally:
        os.killpg(forwarder.pid, signal.SIGKILL)  # it and the sleep it started
        forwarder.wait()


def cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def baseline_main(spec_path: str) -> None:
    """``harness.py baseline SPEC``: the direct RPC run in a process of its own."""
    spec = json.loads(Path(spec_path).read_text())
    direct_rpc(spec["argv"], spec["env"], spec["cwd"], spec["prompt"])


SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

spans = 0

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        global spans
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        for res in ExportTraceServiceRequest.FromString(body).resource_spans:
            spans += sum(len(scope.spans) for scope in res.scope_spans)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        text = str(spans).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class Sink:
    """An OTLP/HTTP receiver on 127.0.0.1, in a process of its own (a collector's CPU is not
    the traced process's), that counts the spans it is sent."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().strip()}"
        self.provider: Any = None

    def traced_run(self, store: Any, cfg: Any, request: Any) -> float:
        """``execute_run`` traced as a service traces its runs: one tracer provider for every
        traced run of this process, built by tether from the ``OTEL_*`` variables (spans held
        until due, then exported in batches behind the runs)."""
        import anyio

        from tether import telemetry
        from tether.harness.run import execute_run

        telemetry.install(self._provider())
        try:
            t = time.perf_counter()
            outcome = anyio.run(functools.partial(execute_run, store, cfg, request))
            took = time.perf_counter() - t
        finally:
            telemetry.install(None)
        if outcome.status.value != "finished":
            raise SystemExit(f"execute_run (traced): {outcome}")
        return took

    def _provider(self) -> Any:
        if self.provider is None:
            from tether.telemetry import setup

            # Left set: the exporter reads them when it is built, once the spans are due.
            # Untraced runs here never read them (telemetry.install(None) decides for them).
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.url
            os.environ["OTEL_SERVICE_NAME"] = "tether-bench"
            built = setup._build()
            assert built is not None, "the otel extra is not installed"
            self.provider = built[0]
        return self.provider

    def spans(self) -> int:
        import urllib.request

        if self.provider is not None:
            self.provider.force_flush()
        with urllib.request.urlopen(self.url) as answer:
            return int(answer.read())

    def close(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
        self.proc.terminate()
        self.proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="provider delay per reply")
    parser.add_argument(
        "--replies", type=int, default=200, help="streamed replies timed for the forwarder"
    )
    parser.add_argument(
        "--against", type=Path, help="also time `tether run` from this src/ (before/after, one run)"
    )
    parser.add_argument(
        "--compile-each-start",
        action="store_true",
        help="run the CLI with this environment's PYTHONDONTWRITEBYTECODE (no bytecode cache)",
    )
    parser.add_argument(
        "--otel", action="store_true", help="also time runs traced (OTLP/HTTP to a local sink)"
    )
    args = parser.parse_args()
    sink = Sink() if args.otel else None

    import anyio

    from provider import Reply, ScriptedProvider, ToolCall  # tests/provider.py
    from tether.config import Config
    from tether.events import RowsMirrored, RunEvent
    from tether.harness.run import RunRequest, execute_run
    from tether.ledger import RunStatus, open_ledger
    from tether.pi.agentdir import write_agent_dir
    from tether.pi.install import extension_file, find_pi, pi_argv, pi_env
    from tether.pi.keys import KEYS_EXTENSION
    from tether.pi.toolchannel import TOOL_NAMES, TOOLS_EXTENSION

    CONTINUATION = extension_file("continuation")

    work = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    # The agent's tools work in tree/, which holds neither the ledger nor the run directories.
    tree = work / "tree"
    tree.mkdir()
    (tree / "notes.txt").write_text("some notes\n" * 20)
    delay = args.latency_ms / 1000

    def reply(req: Any) -> Reply:
        # The turn is the number of tool results the request carries: the same script for
        # every client, whatever order requests arrive in.
        turn = sum(1 for m in req.messages if m.get("role") == "tool")
        if turn >= args.turns - 1:
            return Reply("finished after all the steps", delay_s=delay)
        call = (
            ToolCall("bash", {"command": f"echo step {turn}"})
            if turn % 2 == 0
            else ToolCall("read", {"path": "notes.txt"})
        )
        return Reply(f"step {turn}", tool_calls=[call], delay_s=delay)

    pi = find_pi()
    prompt = "do the steps"
    with ScriptedProvider(reply) as provider:
        config_text = f"""
[ledger]
url = "sqlite://{work}/ledger.db"
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
"""
        cfg_path = work / "tether.toml"
        cfg_path.write_text(config_text)
        # The same run with its pi unconfined: what the sandbox costs a run.
        unconfined_cfg = work / "unconfined.toml"
        unconfined_cfg.write_text(
            config_text.replace('workdir = "tree"', 'workdir = "tree"\nsandbox = "none"')
        )
        # The tree --against times has a ledger of its own: it may be of an older schema.
        against_cfg = work / "against.toml"
        against_cfg.write_text(config_text.replace("ledger.db", "against.db"))
        from tether.config import load_config

        cfg: Config = load_config(cfg_path)
        agent = cfg.agent("bench")

        def baseline_spec(i: int, *, extensions: bool = False) -> Path:
            run_dir = work / ("direct-ext" if extensions else "direct") / str(i)
            agent_dir = write_agent_dir(run_dir / "agent", cfg, "bench")
            (run_dir / "tmp").mkdir()
            argv = pi_argv(
                pi,
                session_file=run_dir / "session.jsonl",
                provider=agent.provider,
                model=agent.model,
                effort=agent.effort,
                tools=[*agent.tools, *TOOL_NAMES] if extensions else agent.tools,
                system_prompt=agent.system_prompt,
                extensions=(KEYS_EXTENSION, CONTINUATION, TOOLS_EXTENSION) if extensions else (),
            )
            spec = {
                "argv": argv,
                "env": pi_env(agent_dir.env, pi, tmpdir=run_dir / "tmp"),
                "cwd": str(tree),
                "prompt": prompt,
            }
            path = run_dir / "spec.json"
            path.write_text(json.dumps(spec))
            return path

        timings: dict[str, list[float]] = {
            "direct": [],
            "direct_ext": [],
            "cli": [],
            "cli_none": [],
            "direct_in": [],
            "inproc": [],
            "startup": [],
            "cpu_direct": [],
            "cpu_tether": [],
            "cpu_pi": [],
            "cpu_run_direct_ext": [],
        }
        lags: list[float] = []
        tether_run = [sys.executable, "-m", "tether", "run"]
        run_args = ["-a", "bench", "--json", prompt]
        # The CLI runs as installed: its modules' bytecode compiled once and cached (in a scratch
        # PYTHONPYCACHEPREFIX, so no tree is written to), not compiled again at every start as
        # PYTHONDONTWRITEBYTECODE (set in this workplace) would have it; one untimed run of
        # each tree fills the cache (and warms the file cache).
        cli_env = dict(os.environ)
        if not args.compile_each_start:
            cli_env.pop("PYTHONDONTWRITEBYTECODE", None)
            cli_env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        # Node's compile cache: each way of `tether run` keeps its own, as on a host whose runs
        # are all sandboxed (only tether's warm-up fills it; the unconfined runs, whose pi
        # writes it, have theirs), not the one the direct runs write.
        none_env = {**cli_env, "XDG_CACHE_HOME": str(work / "cache-none")}
        cli_env["XDG_CACHE_HOME"] = str(work / "cache-cli")
        against_env = None
        if args.against:
            against_env = {
                **cli_env,
                "PYTHONPATH": str(args.against.resolve()),
                "XDG_CACHE_HOME": str(work / "cache-against"),
            }
        warm_ups = ((cfg_path, cli_env), (unconfined_cfg, none_env), (against_cfg, against_env))
        for config, env in warm_ups:
            if env is not None:
                argv = [*tether_run, "--config", str(config), "-s", "warm-up", *run_args]
                done = subprocess.run(argv, capture_output=True, cwd=work, env=env, text=True)
                if done.returncode:
                    sys.exit(f"warm-up `tether run` failed ({done.returncode}): {done.stderr}")
        store = open_ledger(f"sqlite://{work}/inproc.db")
        for i in range(args.reps):
            spec = baseline_spec(i)
            t = time.perf_counter()
            subprocess.run([sys.executable, __file__, "baseline", str(spec)], check=True)
            timings["direct"].append(time.perf_counter() - t)

            spec = baseline_spec(i, extensions=True)
            kids = cpu()[1]
            t = time.perf_counter()
            subprocess.run([sys.executable, __file__, "baseline", str(spec)], check=True)
            timings["direct_ext"].append(time.perf_counter() - t)
            timings["cpu_run_direct_ext"].append(cpu()[1] - kids)

            def cli(
                config: Path, session: str, env: dict[str, str], cpu_as: str | None = None
            ) -> float:
                argv = [*tether_run, "--config", str(config), "-s", session, *run_args]
                kids = cpu()[1]
                t = time.perf_counter()
                done = subprocess.run(argv, capture_output=True, text=True, cwd=work, env=env)
                took = time.perf_counter() - t
                if cpu_as is not None:
                    # The CLI and all it reaped: the keeper, and through it pi and its sandbox.
                    timings.setdefault(cpu_as, []).append(cpu()[1] - kids)
                if done.returncode != 0 or json.loads(done.stdout)["status"] != "finished":
                    raise SystemExit(f"tether run failed: {argv} {done.stdout} {done.stderr}")
                return took

            # The CLI runs compared with each other, in an order rotated every repetition: a
            # run's place (just after pi's direct runs, or after another CLI run) weighs on its
            # time, and rotating keeps that out of their ratios.
            variants: list[tuple[str, Callable[[], float]]] = [
                ("cli", functools.partial(cli, cfg_path, f"cli-{i}", cli_env, "cpu_run_cli")),
                ("cli_none", functools.partial(cli, unconfined_cfg, f"none-{i}", none_env)),
            ]
            if against_env is not None:
                against = functools.partial(
                    cli, against_cfg, f"against-{i}", against_env, "cpu_run_against"
                )
                variants.append(("against", against))
            if sink is not None:
                otel_env = {
                    **cli_env,
                    "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
                    "OTEL_SERVICE_NAME": "tether-bench",
                }
                variants.append(
                    ("cli_otel", functools.partial(cli, cfg_path, f"cli-otel-{i}", otel_env))
                )
            turn = i % len(variants)
            for name, timed in variants[turn:] + variants[:turn]:
                timings.setdefault(name, []).append(timed())

            # The CLI's fixed cost: interpreter, imports (typer, rich, pydantic …), no run.
            t = time.perf_counter()
            subprocess.run([*tether_run, "--help"], capture_output=True, env=cli_env)
            timings["startup"].append(time.perf_counter() - t)

            spec_in = json.loads(baseline_spec(1000 + i).read_text())
            before, thread = cpu(), time.thread_time()
            timings["direct_in"].append(
                direct_rpc(spec_in["argv"], spec_in["env"], spec_in["cwd"], prompt)
            )
            after, thread_after = cpu(), time.thread_time()
            timings["cpu_direct"].append(after[0] - before[0])
            timings.setdefault("thread_direct", []).append(thread_after - thread)
            timings["cpu_pi"].append(after[1] - before[1])

            events: list[RunEvent] = []
            request = RunRequest(session=f"in-{i}", agent="bench", text=prompt, workdir=tree)
            t = time.perf_counter()
            outcome = anyio.run(
                functools.partial(execute_run, store, cfg, request, subscribers=[events.append])
            )
            timings["inproc"].append(time.perf_counter() - t)
            timings["cpu_tether"].append(cpu()[0] - after[0])
            timings.setdefault("thread_tether", []).append(time.thread_time() - thread_after)
            if outcome.status is not RunStatus.FINISHED:
                raise SystemExit(f"execute_run: {outcome}")
            for e in events:
                if isinstance(e, RowsMirrored):
                    lags += [e.written_at - when for when in e.entry_times]
            if sink is not None:
                request = RunRequest(
                    session=f"in-otel-{i}", agent="bench", text=prompt, workdir=tree
                )
                before = cpu()
                timings.setdefault("inproc_otel", []).append(sink.traced_run(store, cfg, request))
                timings.setdefault("cpu_tether_otel", []).append(cpu()[0] - before[0])
        store.close()
        forwarded = forwarder_latency(provider.url, work, args.replies)
        with open_ledger(f"sqlite://{work}/ledger.db") as ledger:
            tool_ms = {
                name + suffix: tool_call_ms(
                    ledger, [f"{prefix}-{i}" for i in range(args.reps)], first=bool(suffix)
                )
                for name, prefix in (("cli", "cli"), ("cli_none", "none"))
                for suffix in ("", "_first")
            }

    def med(name: str) -> float:
        return statistics.median(timings[name])

    def paired(name: str, baseline: str) -> float:
        # Each repetition times both back to back: their ratio drifts less with the load.
        pairs = zip(timings[name], timings[baseline], strict=True)
        return statistics.median(a / b for a, b in pairs)

    rows_per_run = len(lags) / args.reps
    print(
        f"harness bench: {args.turns}-turn run ({args.turns - 1} tool calls), "
        f"{args.reps} repetitions each, provider latency {args.latency_ms:g} ms per reply, "
        f"pi {pi.version}"
    )
    print(f"  direct RPC, own process        median {med('direct'):6.3f} s   (baseline)")
    print(
        f"  direct RPC + tether's extensions median {med('direct_ext'):6.3f} s   "
        f"ratio {med('direct_ext') / med('direct'):.3f}   (median of paired repetitions "
        f"{paired('direct_ext', 'direct'):.3f}): pi loading keys, continuation, tools"
    )
    print(
        f"  tether run (CLI process)       median {med('cli'):6.3f} s   "
        f"ratio {med('cli') / med('direct'):.3f}   (median of paired repetitions "
        f"{paired('cli', 'direct'):.3f})"
    )
    if args.against:
        print(
            f"  tether run from {args.against}  median {med('against'):6.3f} s   "
            f"ratio {med('against') / med('direct'):.3f}   (paired "
            f"{paired('against', 'direct'):.3f}); against direct RPC + tether's extensions "
            f"{med('against') / med('direct_ext'):.3f} (paired "
            f"{paired('against', 'direct_ext'):.3f})"
        )
        print(
            f"    this tree : {args.against} = {med('cli') / med('against'):.3f} "
            f"(paired {paired('cli', 'against'):.3f})"
        )
    print(
        f'    sandboxed : unsandboxed (the same CLI run with sandbox = "none", median '
        f"{med('cli_none'):.3f} s): ratio {med('cli') / med('cli_none'):.3f} (paired "
        f"{paired('cli', 'cli_none'):.3f})"
    )
    print(
        f"    against direct RPC + tether's extensions: ratio "
        f"{med('cli') / med('direct_ext'):.3f} (paired {paired('cli', 'direct_ext'):.3f})"
    )
    print(
        f"    the CLI's start alone (`tether run --help`, not a part of the run since its pi "
        f"starts first): median {med('startup'):.3f} s"
    )
    print(f"  direct RPC, in process         median {med('direct_in'):6.3f} s   (baseline)")
    print(
        f"  execute_run, in process        median {med('inproc'):6.3f} s   "
        f"ratio {med('inproc') / med('direct_in'):.3f}   (median of paired repetitions "
        f"{paired('inproc', 'direct_in'):.3f})"
    )
    print(
        f"  CPU of this process per run (the provider's threads included in both): direct "
        f"{med('cpu_direct'):.3f} s, execute_run {med('cpu_tether'):.3f} s; pi itself "
        f"{med('cpu_pi'):.3f} s"
    )
    print(
        f"    of which this thread (the direct client's reads; execute_run's event loop): direct "
        f"{med('thread_direct'):.3f} s, execute_run {med('thread_tether'):.3f} s"
    )
    against_cpu = f", from {args.against} {med('cpu_run_against'):.3f} s" if args.against else ""
    print(
        f"  CPU of a whole run (the process and all it reaped: pi, and for tether run its keeper "
        f"and sandbox): direct RPC + tether's extensions {med('cpu_run_direct_ext'):.3f} s, "
        f"tether run {med('cpu_run_cli'):.3f} s{against_cpu}"
    )
    added = sorted(x * 1000 for x in forwarded)
    print(
        f"  provider forwarder (outside the sandbox), added time per streamed reply "
        f"({len(added)} replies, each timed direct and through the forwarder's socket): "
        f"p50 {statistics.median(added):.2f} ms, p99 {percentile(added, 0.99):.2f} ms"
    )
    sandboxed, unconfined = sorted(tool_ms["cli"]), sorted(tool_ms["cli_none"])
    print(
        f"  a tool call, from the assistant message that makes it to its result (pi's entry "
        f"timestamps, 1 ms resolution; {len(sandboxed)} calls each): in the tool sandbox p50 "
        f"{statistics.median(sandboxed):.1f} ms, p99 {percentile(sandboxed, 0.99):.1f} ms; "
        f"unsandboxed p50 {statistics.median(unconfined):.1f} ms, p99 "
        f"{percentile(unconfined, 0.99):.1f} ms; added p50 "
        f"{statistics.median(sandboxed) - statistics.median(unconfined):+.1f} ms, p99 "
        f"{percentile(sandboxed, 0.99) - percentile(unconfined, 0.99):+.1f} ms; a run's first "
        f"call, median: {statistics.median(tool_ms['cli_first']):.1f} ms against "
        f"{statistics.median(tool_ms['cli_none_first']):.1f} ms"
    )
    if sink is not None:
        print(
            f"  tracing on : off (OTLP/HTTP to a sink on 127.0.0.1, {sink.spans()} spans "
            f"received): tether run {med('cli_otel') / med('cli'):.3f} (paired "
            f"{paired('cli_otel', 'cli'):.3f}), execute_run "
            f"{med('inproc_otel') / med('inproc'):.3f} "
            f"(paired {paired('inproc_otel', 'inproc'):.3f}); CPU of this process per "
            f"execute_run {med('cpu_tether_otel'):.3f} s : {med('cpu_tether'):.3f} s = "
            f"{med('cpu_tether_otel') / med('cpu_tether'):.3f}"
        )
        sink.close()
    lags_ms = sorted(x * 1000 for x in lags)
    p99 = percentile(lags_ms, 0.99)
    print(
        f"  mirror lag (pi entry → ledger row): median {statistics.median(lags_ms):.1f} ms, "
        f"p99 {p99:.1f} ms, max {lags_ms[-1]:.1f} ms over {len(lags_ms)} rows "
        f"({rows_per_run:.0f} per run; pi's entry timestamps have 1 ms resolution)"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "baseline":
        baseline_main(sys.argv[2])
    else:
        main()
