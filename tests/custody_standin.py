"""TEMPORARY test-only stand-in for custody's harness API (issue 14: run_claimed, reconcile),
until the `custody` branch lands it; removed at the merge. Not shipped."""

from __future__ import annotations

import sys
import types
from typing import Any

import anyio

import tether.harness as harness
from tether.events import EventBus, RunEnded, RunStarted
from tether.harness.run import _Driver, _followup_view, in_thread, runs_dir
from tether.harness.stops import StopControl
from tether.harness.turn import RunRequest
from tether.pi.agentdir import provider_env
from tether.pi.install import find_pi


async def run_claimed(
    ledger: Any,
    config: Any,
    fence: Any,
    *,
    stop: Any = None,
    subscribers: Any = (),
    checkpoint: Any = None,
    clock: Any = None,
    pi: Any = None,
    relay: Any = None,
) -> Any:
    from tether.clock import SystemClock

    run = await in_thread(ledger.get_run, fence.run)
    req = run.extra["request"]
    request = RunRequest(
        session=run.session,
        agent=run.agent,
        text=req["text"],
        actor=req["actor"],
        run_id=run.id,
        extensions=(harness.EXTENSION_PATH,),
    )
    key_env = provider_env(config, request.agent)
    pi = pi or find_pi()
    clock = clock or SystemClock()
    stop = stop or StopControl()
    bus = EventBus(list(subscribers))
    view = await _followup_view(ledger, config, request)
    bus.emit(RunStarted(run=run.id, session=run.session, agent=run.agent, follow_up=bool(view)))
    driver = _Driver(
        ledger=ledger,
        config=config,
        request=request,
        pi=pi,
        clock=clock,
        stop=stop,
        bus=bus,
        fence=fence,
        run_dir=runs_dir(config) / run.id,
        deadline=clock.now() + config.agent(run.agent).deadline_s,
        checkpoint=checkpoint,
        key_env=key_env,
        relay=relay,
    )
    outcome = await driver.drive(view)
    bus.emit(
        RunEnded(
            run=outcome.run,
            status=outcome.status.value,
            stop_reason=outcome.stop_reason.value,
            answer=outcome.answer,
            error=outcome.error,
        )
    )
    return outcome


async def reconcile(ledger: Any, config: Any, *, session: Any = None) -> list[Any]:
    await anyio.lowlevel.checkpoint()
    return []


def install() -> None:
    if not hasattr(harness, "run_claimed"):
        harness.run_claimed = run_claimed  # type: ignore[attr-defined]
    if "tether.harness.custody" not in sys.modules:
        try:
            import tether.harness.custody  # noqa: F401
        except ImportError:
            mod = types.ModuleType("tether.harness.custody")
            mod.reconcile = reconcile  # type: ignore[attr-defined]
            sys.modules["tether.harness.custody"] = mod
            harness.custody = mod  # type: ignore[attr-defined]
