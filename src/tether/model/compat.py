"""What pi sends, made into what llama-cpp-python's server and a small chat template accept.

pi's ``openai-completions`` client (pi-ai ``api/openai-completions.js``) sends user content as a
list of parts, tool results as ``tool`` messages, assistant tool calls with empty content, and
always streams with ``stream_options.include_usage``. llama-cpp-python's chat templates
concatenate strings (a list fails *inside* the stream, after HTTP 200, and pi records an empty
answer), its server refuses streaming with automatic tool choice, and it sends no usage while
streaming (so pi's token counts, and its threshold compaction, would never move).

So every chat request is rewritten to plain string messages without tool fields and run
*non-streamed*; when pi asked for a stream, the finished completion is replayed as SSE chunks
(framed by sse-starlette's :class:`~sse_starlette.event.ServerSentEvent`) ending with a usage
chunk. The model never sees tool schemas: a 135M model cannot call tools;
pi's system prompt still names them, and earlier calls and results reach it as text.

Functions over JSON values; :mod:`tether.model.middleware` applies them to HTTP. Needs the
``local`` extra (sse-starlette), like everything in the model server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sse_starlette.event import ServerSentEvent

__all__ = [
    "StreamPlan",
    "completion_chunks",
    "completion_to_sse",
    "flatten_content",
    "normalize_messages",
    "normalize_request",
]

# Request fields llama-cpp-python's server does not implement, or that would make it refuse or
# switch chat handlers. ``stream``/``stream_options`` are taken over by the replay.
_DROPPED_FIELDS = frozenset(
    {
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "stream",
        "stream_options",
        "store",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "max_completion_tokens",
        "metadata",
        "service_tier",
    }
)
_IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"


@dataclass(frozen=True)
class StreamPlan:
    """How to answer the client: as SSE (replayed) or as the plain JSON completion."""

    stream: bool
    include_usage: bool
    model: str | None = None
    """The model id the client asked for; the replay reports it (llama-cpp-python reports the
    GGUF file's path, which pi would record in every message)."""


def flatten_content(content: object) -> str:
    """A message ``content`` (string, list of parts, or null) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                kind = part.get("type")
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif kind in ("image_url", "image", "input_image"):
                    parts.append(_IMAGE_PLACEHOLDER)
                elif isinstance(part.get("text"), str):
                    parts.append(part["text"])
        return "\n".join(parts)
    return str(content)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _tool_call_text(call: Mapping[str, Any]) -> str:
    function = _mapping(call.get("function")) or _mapping(call.get("custom"))
    name = function.get("name", "?")
    arguments = function.get("arguments", function.get("input", ""))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"[called tool {name} (call {call.get('id', '?')}) with arguments {arguments}]"


def _tool_result_text(message: Mapping[str, Any]) -> str:
    name = message.get("name")
    label = f"tool {name} " if isinstance(name, str) and name else "tool "
    call = message.get("tool_call_id", "?")
    return f"[result of {label}(call {call})]\n{flatten_content(message.get('content'))}"


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Plain ``{"role", "content"}`` string messages with roles system, user and assistant.

    ``developer`` becomes ``system``; assistant tool calls are appended to the assistant's text;
    a run of ``tool`` results becomes one user message (ChatML has no tool role the model knows).
    """
    out: list[dict[str, str]] = []
    pending_results: list[str] = []

    def flush_results() -> None:
        if pending_results:
            out.append({"role": "user", "content": "\n\n".join(pending_results)})
            pending_results.clear()

    for message in messages:
        role = message.get("role")
        if role in ("tool", "function"):
            pending_results.append(_tool_result_text(message))
            continue
        flush_results()
        text = flatten_content(message.get("content"))
        if role == "assistant":
            calls = message.get("tool_calls") or []
            lines = [_tool_call_text(c) for c in calls if isinstance(c, Mapping)]
            text = "\n".join([text, *lines]) if text and lines else text or "\n".join(lines)
            out.append({"role": "assistant", "content": text})
        elif role in ("system", "developer"):
            out.append({"role": "system", "content": text})
        else:
            out.append({"role": "user", "content": text})
    flush_results()
    return out


def normalize_request(body: Mapping[str, Any]) -> tuple[dict[str, Any], StreamPlan]:
    """The request to send on (non-streamed, plain messages) and how to answer the client."""
    stream_options = body.get("stream_options")
    plan = StreamPlan(
        stream=bool(body.get("stream")),
        include_usage=isinstance(stream_options, Mapping)
        and bool(stream_options.get("include_usage")),
        model=body["model"] if isinstance(body.get("model"), str) else None,
    )
    out = {k: v for k, v in body.items() if k not in _DROPPED_FIELDS}
    out["messages"] = normalize_messages(body.get("messages") or [])
    out["stream"] = False
    if "max_tokens" not in out and isinstance(body.get("max_completion_tokens"), int):
        out["max_tokens"] = body["max_completion_tokens"]
    return out, plan


def completion_chunks(completion: Mapping[str, Any], plan: StreamPlan) -> Iterator[str]:
    """A finished ``chat.completion`` as the data of ``chat.completion.chunk`` events.

    The order pi's stream parser expects: role, content, tool calls, the finish reason, then
    (when asked for) a usage chunk with no choices, then ``[DONE]``.
    """
    base = {
        "id": completion.get("id", "chatcmpl-tether"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": plan.model or completion.get("model", ""),
    }

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish}
        return _json({**base, "choices": [choice]})

    choices = completion.get("choices") or [{}]
    choice = _mapping(choices[0])
    message = _mapping(choice.get("message"))
    yield chunk({"role": "assistant", "content": ""})
    text = flatten_content(message.get("content"))
    if text:
        yield chunk({"content": text})
    calls = message.get("tool_calls") or []
    for index, call in enumerate(c for c in calls if isinstance(c, Mapping)):
        yield chunk({"tool_calls": [{**call, "index": index}]})
    finish = choice.get("finish_reason")
    if not isinstance(finish, str) or not finish:
        finish = "tool_calls" if calls else "stop"
    yield chunk({}, finish)
    usage = completion.get("usage")
    if plan.include_usage and isinstance(usage, Mapping):
        yield _json({**base, "choices": [], "usage": dict(usage)})
    yield "[DONE]"


def completion_to_sse(completion: Mapping[str, Any], plan: StreamPlan) -> Iterator[bytes]:
    """:func:`completion_chunks` as encoded SSE events (``data: …`` and a blank line each)."""
    for data in completion_chunks(completion, plan):
        yield ServerSentEvent(data, sep="\n").encode()


def _json(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False)
