"""What bounds a run's tool loop besides its deadline: ``[agents.X] max_turns``,
``max_tool_calls`` and ``max_repeated_tool_calls``, counted from pi's RPC events
(``turn_start``, ``tool_execution_start``: pi's docs/json.md) as they arrive.

The event that takes a run past a bound stops it softly, as a person's stop does (pi gets
``abort`` and ``harness.stop_grace_s`` to settle; the answer so far is kept), and the run's record
says which bound (``stop_reason``: ``turn_limit``, ``tool_call_limit`` or
``repeated_tool_call``) and, in its ``error``, the count. A bound of 0 is no bound.

A repeated call is the same tool with the same arguments (compared as canonical JSON) as the
call before it: a model caught in a loop sends it again and again, while real work, even when it
calls one tool many times, changes the arguments.
"""

from __future__ import annotations

from typing import Any

from tether.config import AgentConfig
from tether.harness.stops import StopControl, StopReason
from tether.pi.client import Record
from tether.pi.protocol import Event
from tether.sizes import canonical_json

__all__ = ["RunBounds"]


class RunBounds:
    """Counts one run's turns and tool calls (from every record pi sends, a resumed run's
    replayed ones included) and stops the run softly at the first bound it passes."""

    def __init__(self, agent_name: str, agent: AgentConfig, stop: StopControl) -> None:
        self.agent_name = agent_name
        self.max_turns = agent.max_turns
        self.max_tool_calls = agent.max_tool_calls
        self.max_repeated = agent.max_repeated_tool_calls
        self.stop = stop
        self.turns = 0
        self.tool_calls = 0
        self.repeated = 0
        """How many times in a row the last call was made (1: once)."""
        self._last: tuple[str, str] | None = None
        self.passed: StopReason | None = None
        """The bound the run passed, once it did."""

    def see(self, item: Record) -> None:
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        if kind == Event.TURN_START:
            self.turns += 1
            if self.max_turns and self.turns > self.max_turns:
                self._passed(
                    StopReason.TURN_LIMIT,
                    f"the run started turn {self.turns}, more than [agents.{self.agent_name}] "
                    f"max_turns ({self.max_turns}) allows",
                )
        elif kind == Event.TOOL_EXECUTION_START:
            self._tool_call(str(item.get("toolName")), item.get("args"))

    def _tool_call(self, name: str, args: Any) -> None:
        self.tool_calls += 1
        try:
            key = (name, canonical_json(args))
        except (TypeError, ValueError):
            key = (name, repr(args))
        self.repeated = self.repeated + 1 if key == self._last else 1
        self._last = key
        if self.max_tool_calls and self.tool_calls > self.max_tool_calls:
            self._passed(
                StopReason.TOOL_CALL_LIMIT,
                f"the run made its tool call {self.tool_calls} ({name}), more than "
                f"[agents.{self.agent_name}] max_tool_calls ({self.max_tool_calls}) allows",
            )
        elif self.max_repeated and self.repeated > self.max_repeated:
            self._passed(
                StopReason.REPEATED_TOOL_CALL,
                f"the run called {name} with the same arguments {self.repeated} times in a row, "
                f"more than [agents.{self.agent_name}] max_repeated_tool_calls "
                f"({self.max_repeated}) allows",
            )

    def _passed(self, reason: StopReason, detail: str) -> None:
        if self.passed is not None:
            return  # stopped once: what pi sends while it settles changes nothing
        self.passed = reason
        self.stop.soft(reason, detail)
