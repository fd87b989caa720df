"""Webhooks: every run's end POSTed, signed, to the endpoints of ``[service.webhooks]``, from the
ledger's outbox (:mod:`tether.ledger.outbox`), at least once.

    await Deliverer(ledger, config, owner="host/pid").run(stopped)   # a worker's task

Each delivering process (every ``Worker``: ``tether serve --workers N``, ``tether worker``)
fans new run ends out into deliveries, and runs one loop per endpoint that claims the
endpoint's due deliveries (at most ``concurrency`` at once) and attempts them. Endpoints never
wait for each other: a dead or slow one only delays its own deliveries, each attempt bounded by
``timeout_s``. A failed attempt (no answer, a timeout, anything but a 2xx) is due again after an
exponential backoff (``backoff_base_s`` doubled per attempt up to ``backoff_cap_s``, jittered)
until ``max_attempts``; an attempt cut short by the process's death is due again when its lease
ends (``2 * timeout_s + 5`` seconds), on any process.

The request: ``POST`` of ``{"id","type":"run.ended","at", …GET /v1/runs/{run}'s fields}`` with
``Content-Type: application/json``, ``Tether-Event-Id`` and ``Idempotency-Key`` (the event id,
the same on every attempt), ``Tether-Event-Type``, ``Tether-Delivery-Attempt`` and
``Tether-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`` keyed by the
secret in the endpoint's ``secret_env`` (signed anew at each attempt). docs/contracts.md shows a
receiver's check.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import msgspec

from tether.access import Admission
from tether.config import Config, WebhookEndpoint, WebhooksConfig
from tether.errors import TetherError
from tether.ledger import Ledger, Run
from tether.ledger.outbox import Delivery, Route
from tether.sandbox.limits import recorded_limits
from tether.service.answers import answer_row
from tether.threads import in_thread

__all__ = ["Deliverer", "backoff_s", "payload", "sign"]

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0
RETAIN_S = 7 * 86_400.0
"""Settled deliveries and their events are removed this long after the run's end."""
FAN_OUT_BATCH = 500


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Tether-Signature`` header: ``t=<timestamp>,v1=<hex HMAC-SHA256 of "t." + body>``."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def backoff_s(config: WebhooksConfig, attempts: int, rand: random.Random | None = None) -> float:
    """The wait after the ``attempts``-th failed attempt: the base doubled per attempt, capped,
    jittered between half and all of it (endpoints coming back are not hit all at once)."""
    delay = min(config.backoff_cap_s, config.backoff_base_s * 2.0 ** max(0, attempts - 1))
    return delay * (0.5 + 0.5 * (rand or random).random())


def lease_s(config: WebhooksConfig) -> float:
    """How long a claimed attempt holds its delivery: past it, the attempt is taken as lost."""
    return 2 * config.timeout_s + 5


def _later(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def payload(ledger: Ledger, delivery: Delivery, run: Run, admission: Admission) -> dict[str, Any]:
    """The event as sent: its id, type and time, then the run as ``GET /v1/runs/{run}`` answers
    it, the answer only when the endpoint's actor is admitted to it (else null, and
    ``answer_withheld``)."""
    request = run.extra.get("request") or {}
    answer = run.extra.get("answer")
    withheld = False
    if answer is not None:
        row = answer_row(ledger, run)
        if row is not None and not admission.admits(row.sources):
            answer, withheld = None, True
    out: dict[str, Any] = {
        "id": delivery.event_id,
        "type": delivery.kind,
        "at": delivery.at,
        "run": run.id,
        "session": run.session,
        "agent": run.agent,
        "actor": request.get("actor"),
        "status": run.status.value,
        "answer": answer,
        "checkpoint": run.extra.get("checkpoint"),
        "stop_reason": run.extra.get("stop_reason"),
        "error": run.extra.get("error"),
        "delivered_into": run.extra.get("delivered_into"),
        "limits_hit": [msgspec.to_builtins(h) for h in recorded_limits(run.extra)] or None,
    }
    if withheld:
        out["answer_withheld"] = True
    return out


class Deliverer:
    """One process's delivery of the outbox (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        config: Config,
        *,
        owner: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.ledger = ledger
        self.config = config
        self.hooks = config.service.webhooks
        self.owner = owner
        self.transport = transport
        self.routes = [
            Route(e.url, frozenset(e.events), frozenset(e.statuses)) for e in self.hooks.endpoints
        ]
        self.sent = 0
        self.failed = 0

    async def run(self, stopped: anyio.Event) -> None:
        """Fan out and deliver until ``stopped`` is set (attempts in flight then finish)."""
        for endpoint in self.hooks.endpoints:
            if endpoint.secret_env not in os.environ:
                log.error(
                    "webhook endpoint %s: its signing secret's variable %s is unset; its "
                    "deliveries wait (and count attempts) until it is set",
                    endpoint.url,
                    endpoint.secret_env,
                )
        async with (
            httpx.AsyncClient(
                transport=self.transport,
                follow_redirects=False,
                timeout=self.hooks.timeout_s,
                headers={"User-Agent": "tether-webhooks/1"},
            ) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(self._fan_out_loop, stopped)
            for endpoint in self.hooks.endpoints:
                tg.start_soon(self._endpoint_loop, client, endpoint, stopped)

    async def _wait(self, stopped: anyio.Event, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await stopped.wait()

    async def _fan_out_loop(self, stopped: anyio.Event) -> None:
        pruned = 0.0
        while not stopped.is_set():
            try:
                n = await in_thread(self.ledger.fan_out, self.routes, limit=FAN_OUT_BATCH)
                if time.monotonic() - pruned > PRUNE_EVERY_S:
                    pruned = time.monotonic()
                    await in_thread(
                        self.ledger.prune_outbox,
                        before=_later(RETAIN_S),
                        endpoints=[r.endpoint for r in self.routes],
                    )
            except TetherError as exc:
                log.warning("fanning out webhook events failed (%s); trying again", exc)
                n = 0
            if n < FAN_OUT_BATCH:
                await self._wait(stopped, self.hooks.poll_s)

    async def _endpoint_loop(
        self, client: httpx.AsyncClient, endpoint: WebhookEndpoint, stopped: anyio.Event
    ) -> None:
        admission = Admission(self.config.access.grants, endpoint.actor)
        while not stopped.is_set():
            try:
                batch = await in_thread(
                    self.ledger.claim_deliveries,
                    endpoint.url,
                    owner=self.owner,
                    lease_s=lease_s(self.hooks),
                    limit=self.hooks.concurrency,
                )
            except TetherError as exc:
                log.warning("claiming deliveries to %s failed (%s)", endpoint.url, exc)
                batch = []
            if not batch:
                await self._wait(stopped, self.hooks.poll_s)
                continue
            async with anyio.create_task_group() as tg:
                for delivery in batch:
                    tg.start_soon(self._attempt, client, endpoint, admission, delivery)

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        endpoint: WebhookEndpoint,
        admission: Admission,
        delivery: Delivery,
    ) -> None:
        try:
            await self._attempt_once(client, endpoint, admission, delivery)
        except TetherError as exc:  # the ledger: the lease lapses and the attempt is made again
            log.warning("webhook delivery %s: %s", delivery.event_id, exc)

    async def _attempt_once(
        self,
        client: httpx.AsyncClient,
        endpoint: WebhookEndpoint,
        admission: Admission,
        delivery: Delivery,
    ) -> None:
        body = await in_thread(self._body, delivery, admission)
        if body is None:
            return
        secret = os.environ.get(endpoint.secret_env)
        status: int | None = None
        if not secret:
            error = f"the signing secret's variable {endpoint.secret_env} is unset or empty"
        else:
            headers = {
                "Content-Type": "application/json",
                "Tether-Event-Id": delivery.event_id,
                "Idempotency-Key": delivery.event_id,
                "Tether-Event-Type": delivery.kind,
                "Tether-Delivery-Attempt": str(delivery.attempts),
                "Tether-Signature": sign(secret.encode(), int(time.time()), body),
            }
            try:
                with anyio.fail_after(self.hooks.timeout_s):
                    answer = await client.post(endpoint.url, content=body, headers=headers)
                status = answer.status_code
                await answer.aclose()
            except TimeoutError:
                error = f"no answer within {self.hooks.timeout_s} s"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if 200 <= status < 300:
                    await in_thread(self.ledger.delivery_sent, delivery.id, status=status)
                    self.sent += 1
                    return
                error = f"answered {status}"
        self.failed += 1
        wait = backoff_s(self.hooks, delivery.attempts)
        retry_at = None if delivery.attempts >= self.hooks.max_attempts else time.time() + wait
        log.warning(
            "webhook %s to %s, attempt %d: %s; %s",
            delivery.event_id,
            endpoint.url,
            delivery.attempts,
            error,
            "given up" if retry_at is None else f"next in {wait:.1f} s",
        )
        await in_thread(
            self.ledger.delivery_failed,
            delivery.id,
            owner=self.owner,
            error=error,
            status=status,
            retry_at=retry_at,
        )

    def _body(self, delivery: Delivery, admission: Admission) -> bytes | None:
        """The event's JSON (the run read now), or None when it is not to be sent (dropped)."""
        run = self.ledger.run(delivery.run)
        if run is None:
            self.ledger.delivery_dropped(delivery.id, reason="the run is gone (erased)")
            return None
        first = self.ledger.row(run.session, 1)
        if first is not None and not admission.admits(first.sources):
            self.ledger.delivery_dropped(
                delivery.id, reason="the endpoint's actor is not admitted to the run's session"
            )
            return None
        event = payload(self.ledger, delivery, run, admission)
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
