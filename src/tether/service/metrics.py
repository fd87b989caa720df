"""``/metrics`` in Prometheus' text format: runs by status and token usage and cost by agent and
model (from the ledger, so every process reports the whole platform), and this process's
checkpoint outcomes and request latency."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence

from tether.ledger import RunStatus
from tether.ledger.usage import UsageLine
from tether.usage import Part

__all__ = ["BUCKETS", "Metrics"]

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the request latency histogram."""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self.checkpoints: Counter[str] = Counter()
        """Checkpoint outcomes of the runs this process's workers executed."""
        self.worker_runs: Counter[str] = Counter()
        """Runs this process's workers executed, by final status."""
        self._latency: dict[tuple[str, str], list[int]] = {}
        self._latency_sum: dict[tuple[str, str], float] = defaultdict(float)
        self._latency_count: Counter[tuple[str, str]] = Counter()
        self.responses: Counter[tuple[str, str, int]] = Counter()

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route)
        buckets = self._latency.setdefault(key, [0] * len(BUCKETS))
        i = bisect.bisect_left(BUCKETS, seconds)
        if i < len(BUCKETS):
            buckets[i] += 1
        self._latency_sum[key] += seconds
        self._latency_count[key] += 1
        self.responses[(method, route, status)] += 1

    def render(self, runs: dict[RunStatus, int], usage: Sequence[UsageLine] = ()) -> str:
        out: list[str] = []
        out += [
            "# HELP tether_runs Runs in the ledger by status.",
            "# TYPE tether_runs gauge",
        ]
        out += [f'tether_runs{{status="{s.value}"}} {runs.get(s, 0)}' for s in RunStatus]
        out += [
            "# HELP tether_runs_queued Runs waiting for a worker.",
            "# TYPE tether_runs_queued gauge",
            f"tether_runs_queued {runs.get(RunStatus.QUEUED, 0)}",
            "# HELP tether_runs_running Live runs.",
            "# TYPE tether_runs_running gauge",
            f"tether_runs_running {runs.get(RunStatus.RUNNING, 0)}",
            "# HELP tether_worker_runs_total Runs this process's workers executed, by status.",
            "# TYPE tether_worker_runs_total counter",
        ]
        out += [
            f'tether_worker_runs_total{{status="{_label(k)}"}} {v}'
            for k, v in sorted(self.worker_runs.items())
        ]
        out += [
            "# HELP tether_checkpoints_total Checkpoint outcomes of this process's runs.",
            "# TYPE tether_checkpoints_total counter",
        ]
        out += [
            f'tether_checkpoints_total{{outcome="{_label(k)}"}} {v}'
            for k, v in sorted(self.checkpoints.items())
        ]
        out += [
            "# HELP tether_http_requests_total HTTP responses by method, route and status.",
            "# TYPE tether_http_requests_total counter",
        ]
        out += [
            f'tether_http_requests_total{{method="{m}",route="{_label(r)}",status="{s}"}} {n}'
            for (m, r, s), n in sorted(self.responses.items())
        ]
        out += [
            "# HELP tether_http_request_seconds Request latency (to the response's start).",
            "# TYPE tether_http_request_seconds histogram",
        ]
        for (method, route), buckets in sorted(self._latency.items()):
            labels = f'method="{method}",route="{_label(route)}"'
            running = 0
            for bound, n in zip(BUCKETS, buckets, strict=True):
                running += n
                out.append(f'tether_http_request_seconds_bucket{{{labels},le="{bound}"}} {running}')
            count = self._latency_count[(method, route)]
            out.append(f'tether_http_request_seconds_bucket{{{labels},le="+Inf"}} {count}')
            out.append(
                f"tether_http_request_seconds_sum{{{labels}}} "
                f"{self._latency_sum[(method, route)]:.6f}"
            )
            out.append(f"tether_http_request_seconds_count{{{labels}}} {count}")
        out += _usage(usage)
        return "\n".join(out) + "\n"


TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


def _usage(lines: Sequence[UsageLine]) -> list[str]:
    """Tokens (by kind), cost and calls of every run in the ledger, by agent, model and part
    (task: the task turns' calls; checkpoint: the continuation checkpoints' summary calls), as
    pi reported them (tether.usage): the rows ``tether usage`` sums by actor."""
    tokens = [
        "# HELP tether_usage_tokens_total Tokens of the runs' provider calls, as pi reported "
        "them, by agent, model, part (task or checkpoint) and kind.",
        "# TYPE tether_usage_tokens_total counter",
    ]
    costs = [
        "# HELP tether_usage_cost_usd_total Cost in USD of the runs' provider calls, as pi "
        "priced them, by agent, model and part.",
        "# TYPE tether_usage_cost_usd_total counter",
    ]
    calls = [
        "# HELP tether_usage_calls_total Provider calls of the runs, by agent, model and part.",
        "# TYPE tether_usage_calls_total counter",
    ]
    for line in lines:
        for part in Part:
            used = line.task if part is Part.TASK else line.checkpoint
            labels = (
                f'agent="{_label(line.agent or "")}",model="{_label(line.model or "")}",'
                f'part="{part.value}"'
            )
            tokens += [
                f'tether_usage_tokens_total{{{labels},kind="{kind}"}} {getattr(used, kind)}'
                for kind in TOKEN_KINDS
            ]
            costs.append(f"tether_usage_cost_usd_total{{{labels}}} {used.cost!r}")
            calls.append(f"tether_usage_calls_total{{{labels}}} {used.calls}")
    return tokens + costs + calls
