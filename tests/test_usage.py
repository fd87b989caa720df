"""A run's token usage and cost (tether.usage), with the real pi and the scripted provider: the
run's record keeps what the provider reported, summed per provider call as pi reports it, the
continuation checkpoint's summary call apart (written or refused); ``GET /v1/runs/{run}``,
``tether log``, the session page, ``tether usage`` and ``/metrics`` show the same figures, on
SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from checkpoint_support import ANSWER, BIG_COMMAND, SUMMARY, config, rows_of, run
from pg import engine_url
from provider import Reply, ToolCall, route
from service_support import serve, write_config
from support.cli import tether
from tether.config import Config, ModelCost
from tether.ledger import ReceiptReason, RowKind, RunStatus, open_ledger

pytestmark = pytest.mark.slow

RATES = ModelCost(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
"""USD per million tokens, as [providers.local.cost] declares them to pi."""

# (prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens) each reply reports.
TOOL_CALL = (1200, 40, 200, 16)
ANSWERED = (3400, 120, 3000, 0)
SUMMARIZED = (5000, 300, 0, 0)


def task_script(summary: Reply) -> Any:
    return route(
        task=[
            Reply(tool_calls=[ToolCall("bash", {"command": BIG_COMMAND})], usage=TOOL_CALL),
            Reply(ANSWER, usage=ANSWERED),
        ],
        summary=[summary],
    )


def expected(*calls: tuple[int, int, int, int]) -> dict[str, Any]:
    """What pi reports for these calls, summed: the prompt less its cached and written tokens
    is input; the cost at :data:`RATES`."""
    out = {"calls": 0, "input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
    cost = 0.0
    for prompt, completion, cached, written in calls:
        fresh = prompt - cached - written
        out["calls"] += 1
        out["input"] += fresh
        out["output"] += completion
        out["cache_read"] += cached
        out["cache_write"] += written
        cost += (
            RATES.input * fresh
            + RATES.output * completion
            + RATES.cache_read * cached
            + RATES.cache_write * written
        ) / 1e6
    tokens = out["input"] + out["output"] + out["cache_read"] + out["cache_write"]
    return {**out, "total_tokens": tokens, "cost": pytest.approx(cost, rel=1e-9, abs=1e-12)}


def priced(cfg: Config) -> Config:
    provider = cfg.providers["local"].model_copy(update={"cost": RATES})
    return cfg.model_copy(update={"providers": {"local": provider}})


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_record_keeps_what_the_provider_reported_the_checkpoint_apart(
    engine: str, scripted_provider: Any, tmp_path: Path
) -> None:
    provider = scripted_provider(task_script(Reply(SUMMARY, usage=SUMMARIZED)))
    with engine_url(engine, tmp_path) as url:
        cfg = priced(config(tmp_path, provider, ledger_url=url))
        with open_ledger(url) as store:
            outcome = run(store, cfg, tmp_path)
            assert (outcome.status, outcome.checkpoint.label) == (RunStatus.FINISHED, "written")
            usage = store.get_run(outcome.run).extra["usage"]
            assert usage["model"] == provider.model
            assert usage["provider"] == "local"
            assert usage["task"] == expected(TOOL_CALL, ANSWERED)
            assert usage["checkpoint"] == expected(SUMMARIZED)
            # The ledger's rows, written with the run's end, sum to the same.
            [line] = store.usage_totals()
            assert (line.actor, line.agent, line.model, line.runs) == (
                "user:ana",
                "rev",
                provider.model,
                1,
            )
            assert msgspec.to_builtins(line.task) == expected(TOOL_CALL, ANSWERED)
            assert msgspec.to_builtins(line.checkpoint) == expected(SUMMARIZED)


def test_a_refused_summary_still_counts_its_call(scripted_provider: Any, tmp_path: Path) -> None:
    """The extension refused the summary (over its bound) after the provider answered: its
    receipt carries the call's usage, and the record counts it as the checkpoint's."""
    too_long = (4000, 2000, 0, 0)
    provider = scripted_provider(task_script(Reply("s" * 8000, usage=too_long)))
    cfg = priced(config(tmp_path, provider, summary_max_bytes=1000))
    with open_ledger(cfg.ledger.url) as store:
        outcome = run(store, cfg, tmp_path)
        assert outcome.checkpoint.label == "refused:over_bound"
        [receipt] = rows_of(store, "s1", RowKind.RECEIPT)
        assert receipt.body == {
            "kind": "continuation_checkpoint_refused",
            "run": outcome.run,
            "reason": ReceiptReason.OVER_BOUND.value,
        }  # the stored receipt stays as it was: the usage is the run's record's
        usage = store.get_run(outcome.run).extra["usage"]
        assert usage["task"] == expected(TOOL_CALL, ANSWERED)
        assert usage["checkpoint"] == expected(too_long)


def _metrics(text: str) -> dict[str, float]:
    """``/metrics``' usage samples summed over agent and model: ``tokens:KIND``, ``cost``,
    ``calls``."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        found = re.fullmatch(r"tether_usage_(\w+)_total\{([^}]*)\} (\S+)", line)
        if not found:
            continue
        family, labels, value = found.groups()
        assert "actor" not in labels  # never a label per actor
        kind = re.search(r'kind="(\w+)"', labels)
        key = f"tokens:{kind.group(1)}" if family == "tokens" and kind else family.split("_")[0]
        sums[key] = sums.get(key, 0.0) + float(value)
    return sums


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_service_the_log_tether_usage_and_metrics_show_the_same_usage(
    engine: str, scripted_provider: Any, tmp_path: Path
) -> None:
    provider = scripted_provider(task_script(Reply(SUMMARY, usage=SUMMARIZED)))
    extra = (
        "\n[followup]\nbudget_bytes = 4000\n"
        "[providers.local.cost]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\n"
        "cache_write = 3.75\n"
    )
    with engine_url(engine, tmp_path) as url:
        cfg = write_config(tmp_path, provider.url, ledger_url=url, extra=extra)
        with serve(tmp_path, cfg, workers=1) as s:
            posted = s.post("u1", "Count to 2000, then tell me the answer.")
            assert posted.status_code == 202, posted.text
            got = s.wait_run(posted.json()["run"])
            assert (got["status"], got["checkpoint"]) == ("finished", "written"), got
            task, checkpoint = expected(TOOL_CALL, ANSWERED), expected(SUMMARIZED)
            assert got["usage"]["task"] == task
            assert got["usage"]["checkpoint"] == checkpoint

            page = s.get("/sessions/u1")
            assert page.status_code == 200
            total = task["total_tokens"]
            assert f'data-role="usage">usage {total:,} tokens' in page.text
            metrics = _metrics(s.get("/metrics").text)

        listed = tether("usage", "--json", "--config", str(cfg))
        assert listed.returncode == 0, listed.stderr
        summed = json.loads(listed.stdout)
        [line] = summed["lines"]
        assert (line["actor"], line["agent"], line["runs"]) == ("user:ana", "rev", 1)
        assert line["task"] == task
        assert line["checkpoint"] == checkpoint
        # tether usage (by actor) and /metrics (by agent and model) agree.
        for kind in ("input", "output", "cache_read", "cache_write"):
            assert metrics[f"tokens:{kind}"] == summed["total"][kind]
        assert metrics["calls"] == summed["total"]["calls"] == 3
        assert metrics["cost"] == pytest.approx(summed["total"]["cost"], rel=1e-9)
        other = tether("usage", "--json", "--actor", "user:bob", "--config", str(cfg))
        assert json.loads(other.stdout)["lines"] == []

        log = tether("log", "-s", "u1", "--json", "--config", str(cfg))
        assert log.returncode == 0, log.stderr
        [record] = [json.loads(x) for x in log.stdout.splitlines() if '"type": "run"' in x]
        assert record["usage"] == got["usage"]
        human = tether("log", "-s", "u1", "--config", str(cfg))
        assert f"usage {total:,} tokens ($" in " ".join(human.stdout.split()), human.stdout
