"""Shared set-up for the continuation checkpoint tests: the real pi, the scripted provider, small
budgets so runs stay short."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import anyio

from provider import Reply, ScriptedProvider, ToolCall
from tether.clock import Clock
from tether.config import (
    AgentConfig,
    Config,
    FollowupConfig,
    HarnessConfig,
    LedgerConfig,
    ProviderConfig,
)
from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint
from tether.harness.relay import RelayHook
from tether.harness.run import CheckpointStep, RunOutcome, RunRequest, execute_run
from tether.harness.stops import StopControl
from tether.ledger import Ledger, Row, RowKind

AGENT = "rev"
SYSTEM_MARK = "SYSPROMPT-7f3a: you review code."
ANSWER = "THE AUTHORED ANSWER: 42 lines changed."
SUMMARY = "## Goal\nCount to 2000 (SUMMARY-MARK-5c1e).\n\n## Progress\n- [x] counted"
Effort = Literal["off", "minimal", "low", "medium", "high", "xhigh"]
BIG_COMMAND = "seq 1 2000"
"""A tool call whose result (about 9 KB) puts the working view over the test budget."""


def pi_config(
    tmp: Path,
    provider: ScriptedProvider,
    *,
    budget: int,
    agent: AgentConfig,
    harness: HarnessConfig,
    ledger_url: str | None = None,
) -> Config:
    """The agent ``rev`` as ``agent`` on the scripted provider (``local``, a 64k window), a
    ``budget``-byte follow-up view, the ledger at ``ledger_url`` or SQLite in ``tmp``."""
    return Config(
        ledger=LedgerConfig(url=ledger_url or f"sqlite://{tmp}/ledger.db"),
        followup=FollowupConfig(budget_bytes=budget),
        providers={
            "local": ProviderConfig(base_url=provider.url, context_window=64_000, max_tokens=2048)
        },
        agents={AGENT: agent},
        harness=harness,
    )


def config(
    tmp: Path,
    provider: ScriptedProvider,
    *,
    budget: int = 4000,
    deadline_s: float = 120,
    min_time_s: float = 0,
    summary_max_bytes: int = 4000,
    stop_grace_s: float = 5,
    ledger_url: str | None = None,
    effort: Effort = "off",
) -> Config:
    """The agent ``rev`` with a continuation checkpoint; a non-``off`` ``effort`` makes the
    scripted model a reasoning one (pi then sends it as ``reasoning_effort``)."""
    return pi_config(
        tmp,
        provider,
        budget=budget,
        ledger_url=ledger_url,
        agent=AgentConfig(
            provider="local",
            model=provider.model,
            system_prompt=SYSTEM_MARK,
            tools=["bash"],
            deadline_s=deadline_s,
            checkpoint_min_time_s=min_time_s,
            summary_max_bytes=summary_max_bytes,
            effort=effort,
        ),
        harness=HarnessConfig(
            runs_dir=tmp / "runs",
            workspaces_dir=tmp / "workspaces",
            stop_grace_s=stop_grace_s,
            # pi's retries, fast: a failing provider is retried as pi would, in milliseconds.
            pi_settings={"retry": {"maxRetries": 2, "baseDelayMs": 10}},
        ),
    )


def long_task(answer: str = ANSWER) -> list[Reply]:
    """A task turn whose working view ends well over a 4 KB budget: one big tool result."""
    return [Reply(tool_calls=[ToolCall("bash", {"command": BIG_COMMAND})]), Reply(answer)]


async def run_once(
    ledger: Ledger,
    cfg: Config,
    tmp: Path,
    *,
    session: str = "s1",
    text: str = "Count to 2000, then tell me the answer.",
    actor: str = "user:ana",
    checkpoint: CheckpointStep | None = continuation_checkpoint,
    extensions: Sequence[Path] = (EXTENSION_PATH,),
    stop: StopControl | None = None,
    clock: Clock | None = None,
    relay: RelayHook | None = None,
) -> RunOutcome:
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    return await execute_run(
        ledger,
        cfg,
        RunRequest(
            session=session,
            agent=AGENT,
            text=text,
            actor=actor,
            workdir=workdir,
            extensions=tuple(extensions),
        ),
        checkpoint=checkpoint,
        stop=stop,
        clock=clock,
        relay=relay,
    )


def run(ledger: Ledger, cfg: Config, tmp: Path, **kw: Any) -> RunOutcome:
    async def go() -> RunOutcome:
        return await run_once(ledger, cfg, tmp, **kw)

    return anyio.run(go)


def rows_of(ledger: Ledger, session: str, kind: RowKind) -> list[Row]:
    return [r for r in ledger.iter_rows(session) if r.kind is kind]


async def wait_for(predicate: Any, within: float = 30.0) -> None:
    """Poll ``predicate`` (state another thread changes, e.g. the provider's requests)."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 (no event to wait on across threads)
            await anyio.sleep(0.02)


def pi_processes(marker: str) -> list[int]:
    """Pids of live processes whose environment mentions ``marker`` (a run's directory: pi's
    ``PI_CODING_AGENT_DIR`` lies inside it; pi retitles itself, so its cmdline cannot tell)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                cmdline = f.read().decode("utf-8", "replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found
