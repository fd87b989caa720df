"""Continuation checkpoint benchmark: what a qualifying run pays for its checkpoint.

One scripted provider (tests/provider.py) and one task: ``--calls`` bash calls, each printing
``--result-bytes`` bytes, then a text answer, so the working view ends over the budget. Three
variants of the same run, in process (``execute_run``), interleaved repetition by repetition:

- ``baseline``: no continuation extension, no checkpoint step;
- ``extension``: the extension loaded (pi compiles it at start), no checkpoint step;
- ``checkpoint``: the extension and the checkpoint step (what ``tether run`` does).

Per qualifying run it reports the extra provider calls against the baseline (must be exactly
one: the summary), the checkpoint step's wall time, the summary call's own time as the provider
served it (request in to last byte out, ``--summary-ms`` of it simulated latency), and the
difference: the wall time the checkpoint adds beyond the summary call (measuring the view,
checking the extension, pi's hook and compaction entry, the mirror's fenced write, the ledger
reads). Run wall times are printed as ratios against the baseline measured in the same run.

    .venv/bin/python bench/checkpoint.py                      # 5 reps, 1 call of 9 KB
    .venv/bin/python bench/checkpoint.py --calls 20 --result-bytes 12000 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from provider import Reply, ScriptedProvider, ToolCall, route  # noqa: E402
from tether.config import (  # noqa: E402
    AgentConfig,
    Config,
    FollowupConfig,
    HarnessConfig,
    LedgerConfig,
    ProviderConfig,
)
from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint  # noqa: E402
from tether.harness.run import (  # noqa: E402
    CheckpointResult,
    RunOutcome,
    RunRequest,
    SettledTurn,
    execute_run,
)
from tether.ledger import open_ledger  # noqa: E402

SUMMARY = "## Goal\nProduce the output.\n\n## Progress\n- [x] done\n\n## Next Steps\n1. none"
VARIANTS = ("baseline", "extension", "checkpoint")


class TimedProvider:
    """The scripted provider, with each request's service time (request in → handler done)."""

    def __init__(self, script: Any) -> None:
        self.provider = ScriptedProvider(script)
        self.served: list[tuple[bool, float]] = []  # (is summary, seconds)
        self._lock = threading.Lock()
        base = self.provider._server.RequestHandlerClass
        outer = self

        class Timed(base):  # type: ignore[misc,valid-type]
            def do_POST(self) -> None:
                start = time.perf_counter()
                before = len(outer.provider.requests)
                super().do_POST()
                took = time.perf_counter() - start
                req = (
                    outer.provider.requests[before]
                    if len(outer.provider.requests) > before
                    else None
                )
                with outer._lock:
                    outer.served.append((bool(req and req.is_summary), took))

        self.provider._server.RequestHandlerClass = Timed

    def __enter__(self) -> TimedProvider:
        self.provider.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.provider.stop()


def task_script(calls: int, result_bytes: int, answer: str) -> list[Reply]:
    command = f"head -c {result_bytes} /dev/zero | tr '\\0' x"
    steps = [Reply(tool_calls=[ToolCall("bash", {"command": command})]) for _ in range(calls)]
    return [*steps, Reply(answer)]


def make_config(tmp: Path, url: str, budget: int) -> Config:
    return Config(
        ledger=LedgerConfig(url=f"sqlite://{tmp}/ledger.db"),
        followup=FollowupConfig(budget_bytes=budget),
        providers={"local": ProviderConfig(base_url=url, context_window=400_000, max_tokens=4096)},
        agents={
            "bench": AgentConfig(
                provider="local",
                model="scripted",
                tools=["bash"],
                deadline_s=600,
                checkpoint_min_time_s=0,
            )
        },
        harness=HarnessConfig(runs_dir=tmp / "runs"),
    )


def one_run(variant: str, args: argparse.Namespace, rep: int) -> dict[str, float]:
    answer = f"answer {variant} {rep}"
    delay = args.summary_ms / 1000
    script = route(
        task=task_script(args.calls, args.result_bytes, answer),
        summary=[Reply(SUMMARY, delay_s=delay)],
    )
    step_times: list[float] = []

    async def timed_step(turn: SettledTurn) -> CheckpointResult:
        start = time.perf_counter()
        try:
            return await continuation_checkpoint(turn)
        finally:
            step_times.append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory(prefix="tether-bench-ckpt-") as d, TimedProvider(script) as tp:
        tmp = Path(d)
        (tmp / "work").mkdir()
        cfg = make_config(tmp, tp.provider.url, args.budget)
        ledger = open_ledger(cfg.ledger.url)
        request = RunRequest(
            session="s1",
            agent="bench",
            text="Produce the output.",
            workdir=tmp / "work",
            extensions=() if variant == "baseline" else (EXTENSION_PATH,),
        )

        async def go() -> RunOutcome:
            return await execute_run(
                ledger,
                cfg,
                request,
                checkpoint=timed_step if variant == "checkpoint" else None,
            )

        start = time.perf_counter()
        outcome = anyio.run(go)
        wall = time.perf_counter() - start
        ledger.close()
        if outcome.answer != answer:
            raise SystemExit(f"{variant}: the answer changed: {outcome.answer!r}")
        expected = "written" if variant == "checkpoint" else "not_needed"
        if outcome.checkpoint.label != expected:
            raise SystemExit(f"{variant}: checkpoint {outcome.checkpoint}, expected {expected}")
        summaries = [t for is_summary, t in tp.served if is_summary]
        return {
            "wall": wall,
            "requests": len(tp.provider.requests),
            "summary_requests": len(summaries),
            "summary_s": summaries[0] if summaries else 0.0,
            "step_s": step_times[0] if step_times else 0.0,
        }


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p90(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--result-bytes", type=int, default=9000)
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--summary-ms", type=float, default=200.0)
    args = parser.parse_args()

    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    one_run("checkpoint", args, -1)  # warm-up: pi's first compile of the extension, caches
    for rep in range(args.reps):
        for variant in VARIANTS:
            results[variant].append(one_run(variant, args, rep))

    base = results["baseline"]
    ext = results["extension"]
    ckpt = results["checkpoint"]
    extra_calls = {int(c["requests"] - b["requests"]) for c, b in zip(ckpt, base, strict=True)}
    summary_calls = {int(c["summary_requests"]) for c in ckpt}
    beyond = [c["step_s"] - c["summary_s"] for c in ckpt]

    print(
        f"checkpoint benchmark: {args.reps} reps, {args.calls} tool call(s) of "
        f"{args.result_bytes} B, budget {args.budget} B, summary latency {args.summary_ms:g} ms"
    )
    print(
        f"  extra provider calls per qualifying run: {sorted(extra_calls)} (summary requests: "
        f"{sorted(summary_calls)})"
    )
    print(
        f"  checkpoint step wall:          median {med([c['step_s'] for c in ckpt]) * 1000:8.1f} ms"
        f"  p90 {p90([c['step_s'] for c in ckpt]) * 1000:8.1f} ms"
    )
    served = [c["summary_s"] for c in ckpt]
    print(
        f"  summary call (provider side):  median {med(served) * 1000:8.1f} ms"
        f"  p90 {p90(served) * 1000:8.1f} ms"
    )
    print(
        f"  added beyond the summary call: median {med(beyond) * 1000:8.1f} ms"
        f"  p90 {p90(beyond) * 1000:8.1f} ms"
    )
    bw = med([b["wall"] for b in base])
    print(f"  run wall, baseline (no extension, no checkpoint): median {bw:.3f} s = 1.00")
    for name, rows in (("extension loaded, no checkpoint", ext), ("checkpoint", ckpt)):
        w = med([r["wall"] for r in rows])
        print(f"  run wall, {name}: median {w:.3f} s = {w / bw:.2f}x baseline")
    if extra_calls != {1} or summary_calls != {1}:
        raise SystemExit("a qualifying run must add exactly one provider call")


if __name__ == "__main__":
    main()
