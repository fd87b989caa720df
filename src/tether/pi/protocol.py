"""pi's RPC vocabulary (pi 1.6.0 ``docs/rpc-commands.md``, ``json.md``, ``rpc-extension-ui.md``),
named one for one. Values are pi's wire strings."""

from __future__ import annotations

import enum
from typing import Any

import msgspec

__all__ = [
    "DIALOG_METHODS",
    "Command",
    "Disposition",
    "Event",
    "PiStopReason",
    "Response",
    "UiMethod",
]


class Command(enum.StrEnum):
    """Commands written to pi's stdin."""

    PROMPT = "prompt"
    STEER = "steer"
    FOLLOW_UP = "follow_up"
    ABORT = "abort"
    CLEAR_QUEUE = "clear_queue"
    NEW_SESSION = "new_session"
    GET_STATE = "get_state"
    GET_MESSAGES = "get_messages"
    SET_MODEL = "set_model"
    SET_THINKING_LEVEL = "set_thinking_level"
    COMPACT = "compact"
    SET_AUTO_COMPACTION = "set_auto_compaction"
    SET_AUTO_RETRY = "set_auto_retry"
    ABORT_RETRY = "abort_retry"
    BASH = "bash"
    ABORT_BASH = "abort_bash"
    GET_SESSION_STATS = "get_session_stats"
    GET_ENTRIES = "get_entries"
    GET_LAST_ASSISTANT_TEXT = "get_last_assistant_text"
    GET_COMMANDS = "get_commands"
    EXTENSION_UI_RESPONSE = "extension_ui_response"


class Event(enum.StrEnum):
    """Records pi writes to stdout (besides ``response`` and ``extension_ui_request``)."""

    AGENT_START = "agent_start"
    AGENT_END = "agent_end"
    AGENT_SETTLED = "agent_settled"
    TURN_START = "turn_start"
    TURN_END = "turn_end"
    MESSAGE_START = "message_start"
    MESSAGE_UPDATE = "message_update"
    MESSAGE_END = "message_end"
    TOOL_EXECUTION_START = "tool_execution_start"
    TOOL_EXECUTION_UPDATE = "tool_execution_update"
    TOOL_EXECUTION_END = "tool_execution_end"
    QUEUE_UPDATE = "queue_update"
    ENTRY_APPENDED = "entry_appended"
    SESSION_INFO_CHANGED = "session_info_changed"
    THINKING_LEVEL_CHANGED = "thinking_level_changed"
    COMPACTION_START = "compaction_start"
    COMPACTION_END = "compaction_end"
    AUTO_RETRY_START = "auto_retry_start"
    AUTO_RETRY_END = "auto_retry_end"
    SUMMARIZATION_RETRY_SCHEDULED = "summarization_retry_scheduled"
    SUMMARIZATION_RETRY_ATTEMPT_START = "summarization_retry_attempt_start"
    SUMMARIZATION_RETRY_FINISHED = "summarization_retry_finished"
    BASH_EXECUTION_UPDATE = "bash_execution_update"
    EXTENSION_ERROR = "extension_error"

    # The two record families that are not session events.
    RESPONSE = "response"
    EXTENSION_UI_REQUEST = "extension_ui_request"


class UiMethod(enum.StrEnum):
    SELECT = "select"
    CONFIRM = "confirm"
    INPUT = "input"
    EDITOR = "editor"
    NOTIFY = "notify"
    SET_STATUS = "setStatus"
    SET_WIDGET = "setWidget"
    SET_TITLE = "setTitle"
    SET_EDITOR_TEXT = "set_editor_text"


DIALOG_METHODS = frozenset({UiMethod.SELECT, UiMethod.CONFIRM, UiMethod.INPUT, UiMethod.EDITOR})
"""Extension UI requests that block pi until the client answers (tether cancels them)."""


class Disposition(enum.StrEnum):
    """What pi did with a ``prompt`` (its response's ``data.disposition``)."""

    STARTED = "started"
    QUEUED = "queued"
    HANDLED = "handled"


class PiStopReason(enum.StrEnum):
    """An assistant message's ``stopReason``."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_USE = "toolUse"
    ERROR = "error"
    ABORTED = "aborted"

    @classmethod
    def of(cls, message: dict[str, Any] | None) -> PiStopReason | None:
        """The stop reason of an assistant message (None when absent or unknown)."""
        value = (message or {}).get("stopReason")
        try:
            return cls(value) if isinstance(value, str) else None
        except ValueError:
            return None


class Response(msgspec.Struct, frozen=True):
    """A ``response`` record. ``id`` is None for pi's id-less answers (parse errors, unknown
    commands)."""

    command: str
    success: bool
    id: str | None = None
    data: Any = None
    error: str | None = None
    raw: dict[str, Any] = msgspec.field(default_factory=dict)

    @staticmethod
    def from_record(record: dict[str, Any]) -> Response:
        rid = record.get("id")
        err = record.get("error")
        return Response(
            command=str(record.get("command", "")),
            success=bool(record.get("success")),
            id=rid if isinstance(rid, str) else None,
            data=record.get("data"),
            error=err if isinstance(err, str) else None,
            raw=record,
        )
