"""What one actor's runs may use in a day ([service.budgets]; tether.service.budgets): a request
whose actor's day is at its budget is refused with 429 and nothing is written, and a live run that
takes its actor over the budget is stopped softly, its record saying so. Counted in the ledger
from every run's usage (tether.ledger.usage), on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pg import engine_url
from provider import Reply, ToolCall
from service_support import serve, write_config
from tether.config import ServiceBudgets, parse_config
from tether.ledger import Fence, Ledger, RunStatus, open_ledger
from tether.ledger.usage import BudgetExhausted, DayBudget, DayUsage
from tether.usage import DAY_S

BIG = (20_000, 10)
"""A provider call's (prompt, completion) tokens: twice ana's budget at once."""


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_budget_stops_a_live_run_that_crosses_it_then_refuses_requests(
    engine: str, scripted_provider: Any, tmp_path: Path
) -> None:
    ana = iter(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})], usage=BIG),
            Reply("an answer that comes too late", delay_s=30),  # the stop lands before it
        ]
    )
    provider = scripted_provider(
        lambda req: Reply("hi bob") if req.contains("Hello.") else next(ana)
    )
    extra = '\n[service.budgets.actors."user:ana"]\ntokens_per_day = 10000\n'
    with engine_url(engine, tmp_path) as url:
        config = write_config(tmp_path, provider.url, ledger_url=url, extra=extra)
        with serve(tmp_path, config, workers=1) as s:
            started = time.monotonic()
            first = s.post("b-1", "Say hi.", request_id="k1")
            assert first.status_code == 202, first.text
            done = s.wait_run(first.json()["run"])
            assert time.monotonic() - started < 25, "the run waited for the slow reply"
            assert (done["status"], done["stop_reason"]) == ("interrupted", "budget_exhausted")
            assert "tokens_per_day allows (10000)" in done["error"], done["error"]
            assert done["usage"]["task"]["total_tokens"] == sum(BIG)
            assert len(provider.requests) <= 2  # stopped before the slow one ended

            # Her day is over budget now: a request is refused, and nothing is written.
            refused = s.post("b-2", "Again.")
            assert refused.status_code == 429, refused.text
            body = refused.json()
            assert body["error"] == "budget_exhausted"
            detail = body["detail"]
            assert (detail["status"], detail["reason"]) == ("refused", "budget_exhausted")
            assert (detail["budget"], detail["actor"]) == ("tokens_per_day", "user:ana")
            assert (detail["allowed"], detail["used"]) == (10_000, sum(BIG))
            retry = int(refused.headers["retry-after"])
            assert retry == detail["retry_after_s"]
            assert 1 <= retry <= DAY_S
            # The same request again (its request_id) is answered as before.
            again = s.post("b-1", "Say hi.", request_id="k1")
            assert (again.status_code, again.json()) == (202, first.json())
            # Bob has no budget (none by default): he is not held back by hers.
            bob = s.post("b-bob", "Hello.", token="bob-token")
            assert bob.status_code == 202, bob.text
            assert s.wait_run(bob.json()["run"], token="bob-token")["status"] == "finished"
        with open_ledger(url) as ledger:
            assert sorted(x.id for x in ledger.sessions()) == ["b-1", "b-bob"]
            assert ledger.actor_usage("user:ana", since=0).tokens == sum(BIG)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_cost_budget_is_counted_in_the_transaction_that_would_insert(
    engine: str, tmp_path: Path
) -> None:
    with engine_url(engine, tmp_path) as url, open_ledger(url) as ledger:
        budget = DayBudget(actor="user:ana", cost=0.05)
        run, _ = ledger.enqueue_run("c-1", "rev", actor="user:ana", text="x", budget=budget)
        _end_with_cost(ledger, run.id, 0.06)
        with pytest.raises(BudgetExhausted) as refused:
            ledger.enqueue_run("c-2", "rev", actor="user:ana", text="y", budget=budget)
        assert refused.value.to_json() == {
            "budget": "cost_per_day",
            "actor": "user:ana",
            "allowed": 0.05,
            "used": 0.06,
            "retry_after_s": refused.value.retry_after_s,
        }
        assert ledger.session("c-2") is None  # nothing written, not even the session
        # Another actor's budget counts its own runs only.
        bob = DayBudget(actor="user:bob", cost=0.05)
        ledger.enqueue_run("c-3", "rev", actor="user:bob", text="z", budget=bob)
        assert ledger.actor_usage("user:ana", since=0) == DayUsage(0, 0.06)
        assert ledger.actor_usage("user:bob", since=0) == DayUsage(0, 0.0)


def _end_with_cost(ledger: Ledger, run_id: str, cost: float) -> None:
    fence: Fence = ledger.claim_run(run_id)
    usage = {"model": "m", "task": {"calls": 1, "cost": cost}}
    ledger.end_run(fence, RunStatus.FINISHED, extra={"usage": usage})


def test_a_default_budget_and_an_actors_own() -> None:
    text = (
        "[service.budgets]\ntokens_per_day = 1000\n"
        '[service.budgets.actors."user:ana"]\ncost_per_day = 2.5\n'
        '[service.budgets.actors."bot:ci"]\ntokens_per_day = 0\n'
    )
    budgets: ServiceBudgets = parse_config(text, Path("t.toml")).service.budgets
    assert budgets.of("user:bob") == (1000, None)
    assert budgets.of("user:ana") == (1000, 2.5)
    assert budgets.of("bot:ci") == (0, None)
    assert ServiceBudgets().of("user:bob") == (None, None)
    assert DayBudget.of(ServiceBudgets(), "user:bob") is None
    zero = DayBudget.of(budgets, "bot:ci")
    assert zero is not None
    assert zero.exhausted(DayUsage(0, 0.0), 0.0) is not None
