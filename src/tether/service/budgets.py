"""What one actor's runs may use in a day (``[service.budgets]``: tokens and cost, a default and
per-actor overrides), as the ledger sums it (tether.ledger.usage): the budget a request is
admitted by (:func:`request_budget`), and the answer to one over it (:func:`install`).

A request whose actor's day is at its budget is refused in the transaction that would insert its
run (so nothing is written, not even its new session) with 429 and ``Retry-After`` (when the UTC
day, and so the budget, renews). A run the service's workers execute is bounded by the same
budget while it goes: it writes its usage after each provider call and is stopped softly once its
actor's day reaches the budget (``stop_reason`` ``budget_exhausted``; tether.harness.usage).
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from tether.config import Config
from tether.ledger.usage import BudgetExhausted, DayBudget

__all__ = ["ERROR", "install", "request_budget"]

ERROR = "budget_exhausted"
"""The ``error`` (and ``reason``) of a refusal over budget."""


def request_budget(config: Config, actor: str) -> DayBudget | None:
    """The budget a request of ``actor`` is admitted by (None: it has none)."""
    return DayBudget.of(config.service.budgets, actor)


def install(app: FastAPI) -> None:
    """Answer a request over its actor's budget: 429, ``Retry-After`` in seconds, and
    ``{"error": "budget_exhausted", "detail": {"status": "refused", "reason":
    "budget_exhausted", "budget", "actor", "allowed", "used", "retry_after_s", "detail"}}``
    (the API's refusals' shape, as a limit's 429 has it)."""

    async def over_budget(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BudgetExhausted)
        detail = {"status": "refused", "reason": ERROR, **exc.to_json(), "detail": str(exc)}
        return JSONResponse(
            {"error": ERROR, "detail": detail},
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    app.add_exception_handler(BudgetExhausted, over_budget)
