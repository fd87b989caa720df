"""What bounds a run's tool loop besides its deadline ([agents.X] max_turns, max_tool_calls,
max_repeated_tool_calls; tether.harness.bounds), with the real pi and a scripted provider that
never stops calling tools: the run is stopped softly at the bound, its answer so far kept, and
its record says which bound and how far it went.

The stop is soft: pi gets ``abort`` a moment after the call that passed the bound (the harness
first checks no newer owner holds the run), and a model answering at once may make a call or
two more meanwhile; the record counts every call pi started, and its error names the one that
passed the bound."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_support import config, run
from pg import engine_url
from provider import RecordedRequest, Reply, ToolCall
from tether.config import AgentConfig, Config
from tether.harness.stops import StopReason
from tether.ledger import RunStatus, open_ledger

pytestmark = pytest.mark.slow

DEADLINE_S = 40
"""Without the bounds these runs go on to the deadline (and end ``deadline``)."""
SLACK = 5
"""Calls a model that answers at once may make between the bound and pi taking the abort."""


def bounded(cfg: Config, **bounds: int) -> Config:
    agent: AgentConfig = cfg.agents["rev"].model_copy(update={"tools": ["bash"], **bounds})
    return cfg.model_copy(update={"agents": {"rev": agent}})


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_model_repeating_one_tool_call_is_stopped_at_the_bound(
    engine: str, scripted_provider: Any, tmp_path: Path
) -> None:
    """The incident: a small model saving the same note again and again. The default bound
    (8 in a row) stops it at the ninth call."""
    provider = scripted_provider(
        lambda req: Reply("noting", tool_calls=[ToolCall("note", {"text": "the same note"})])
    )
    with engine_url(engine, tmp_path) as url:
        cfg = bounded(config(tmp_path, provider, deadline_s=DEADLINE_S, ledger_url=url))
        assert cfg.agents["rev"].max_repeated_tool_calls == 8  # the default
        with open_ledger(url) as store:
            outcome = run(store, cfg, tmp_path, text="Keep a note.")
            record = store.get_run(outcome.run).extra
            notes = store.notes("s1", "rev")
    assert (outcome.status, outcome.stop_reason) == (
        RunStatus.INTERRUPTED,
        StopReason.REPEATED_TOOL_CALL,
    )
    assert record["stop_reason"] == "repeated_tool_call"
    assert 9 <= record["tool_calls"] <= 9 + SLACK
    assert "note with the same arguments 9 times in a row" in record["error"]
    assert "max_repeated_tool_calls (8)" in record["error"]
    assert outcome.answer == "noting"  # what it wrote so far is kept
    assert len(provider.task_requests) <= 10 + SLACK  # stopped there, not at the deadline
    assert 8 <= len(notes) <= 9 + SLACK


def _counting(req: RecordedRequest, n: Iterator[int]) -> Reply:
    """A tool call with new arguments every time: never the same call twice."""
    return Reply(tool_calls=[ToolCall("bash", {"command": f"echo {next(n)}"})])


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_model_making_many_different_calls_is_stopped_at_max_tool_calls(
    engine: str, scripted_provider: Any, tmp_path: Path
) -> None:
    counter = itertools.count(1)
    provider = scripted_provider(lambda req: _counting(req, counter))
    with engine_url(engine, tmp_path) as url:
        cfg = bounded(
            config(tmp_path, provider, deadline_s=DEADLINE_S, ledger_url=url), max_tool_calls=12
        )
        with open_ledger(url) as store:
            outcome = run(store, cfg, tmp_path, text="Count.")
            record = store.get_run(outcome.run).extra
    assert (outcome.status, outcome.stop_reason) == (
        RunStatus.INTERRUPTED,
        StopReason.TOOL_CALL_LIMIT,
    )
    assert record["stop_reason"] == "tool_call_limit"
    assert 13 <= record["tool_calls"] <= 13 + SLACK
    assert "tool call 13 (bash)" in record["error"]
    assert "max_tool_calls (12)" in record["error"]
    assert len(provider.task_requests) <= 14 + SLACK


def test_turns_are_bounded(scripted_provider: Any, tmp_path: Path) -> None:
    counter = itertools.count(1)
    provider = scripted_provider(lambda req: _counting(req, counter))
    cfg = bounded(config(tmp_path, provider, deadline_s=DEADLINE_S), max_turns=3)
    with open_ledger(cfg.ledger.url) as store:
        outcome = run(store, cfg, tmp_path, text="Count.")
        record = store.get_run(outcome.run).extra
    assert outcome.stop_reason is StopReason.TURN_LIMIT
    assert record["stop_reason"] == "turn_limit"
    assert 4 <= record["turns"] <= 4 + SLACK
    assert "turn 4, more than [agents.rev] max_turns (3)" in record["error"]


def test_the_defaults_are_generous() -> None:
    agent = AgentConfig(provider="p", model="m")
    assert (agent.max_turns, agent.max_tool_calls, agent.max_repeated_tool_calls) == (200, 500, 8)
