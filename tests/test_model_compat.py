"""The compatibility layer between pi's openai-completions client and llama-cpp-python's server
(tether.model.compat, tether.model.middleware): fast, no model."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import anyio
import pytest

from tether.model.compat import (
    StreamPlan,
    completion_to_sse,
    flatten_content,
    normalize_messages,
    normalize_request,
)
from tether.model.middleware import CompatMiddleware

# A request shaped as pi 1.6 sends it (pi-ai api/openai-completions.js convertMessages) with the
# compat flags tether writes for the local provider.
PI_REQUEST: dict[str, Any] = {
    "model": "smollm2",
    "messages": [
        {"role": "system", "content": "You are pi."},
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"ls"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"a.py"}'},
                },
            ],
        },
        {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "call_1"},
        {"role": "tool", "content": "print(1)", "tool_call_id": "call_2", "name": "read"},
        {"role": "assistant", "content": "I have processed the tool results."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "And this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
    ],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 512,
    "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
    "tool_choice": "auto",
    "store": False,
}

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "smollm2",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Two files."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43},
}


def sse_payloads(events: list[bytes]) -> list[Any]:
    """Decode SSE events back into their data payloads ("[DONE]" stays a string)."""
    out: list[Any] = []
    for event in b"".join(events).decode().split("\n\n"):
        if not event:
            continue
        assert event.startswith("data: "), event
        data = event.removeprefix("data: ")
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --- pure transforms ---------------------------------------------------------------------------


def test_flatten_content_joins_text_parts_and_replaces_images() -> None:
    assert flatten_content(None) == ""
    assert flatten_content("plain") == "plain"
    parts = [
        {"type": "text", "text": "one"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "two"},
    ]
    flat = flatten_content(parts)
    assert flat.startswith("one\n")
    assert flat.endswith("\ntwo")
    assert "AAAA" not in flat
    assert "image omitted" in flat


def test_messages_become_plain_strings_in_three_roles() -> None:
    out = normalize_messages(PI_REQUEST["messages"])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert all(isinstance(m["content"], str) and set(m) == {"role", "content"} for m in out)
    assert out[1]["content"] == "List the files."


def test_tool_calls_and_results_are_rendered_as_text_in_order() -> None:
    out = normalize_messages(PI_REQUEST["messages"])
    calls = out[2]["content"]
    assert "bash" in calls
    assert '{"command":"ls"}' in calls
    assert "call_1" in calls
    assert calls.index("call_1") < calls.index("call_2")
    results = out[3]["content"]  # both tool results, one user message, call order kept
    assert results.index("a.py\nb.py") < results.index("print(1)")
    assert "call_1" in results
    assert "tool read" in results


def test_null_content_and_developer_role() -> None:
    out = normalize_messages(
        [
            {"role": "developer", "content": "rules"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": None},
        ]
    )
    assert out == [
        {"role": "system", "content": "rules"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": ""},
    ]


def test_trailing_tool_results_are_flushed() -> None:
    out = normalize_messages([{"role": "tool", "content": "done", "tool_call_id": "c9"}])
    assert out == [{"role": "user", "content": "[result of tool (call c9)]\ndone"}]


def test_request_is_sent_non_streamed_without_tool_fields() -> None:
    request, plan = normalize_request(PI_REQUEST)
    assert plan == StreamPlan(stream=True, include_usage=True, model="smollm2")
    assert request["stream"] is False
    for field in ("tools", "tool_choice", "stream_options", "store"):
        assert field not in request
    assert request["max_tokens"] == 512
    assert request["model"] == "smollm2"
    assert PI_REQUEST["stream"] is True  # the caller's body is not modified


def test_max_completion_tokens_becomes_max_tokens() -> None:
    request, plan = normalize_request({"messages": [], "max_completion_tokens": 77})
    assert request["max_tokens"] == 77
    assert "max_completion_tokens" not in request
    assert plan == StreamPlan(stream=False, include_usage=False)


def test_completion_replays_as_chunks_ending_with_usage() -> None:
    completion = {**COMPLETION, "model": "/site-packages/x/model.gguf"}
    payloads = sse_payloads(list(completion_to_sse(completion, StreamPlan(True, True, "smollm2"))))
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert {(c["id"], c["model"]) for c in chunks} == {("chatcmpl-1", "smollm2")}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Two files."
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop"
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == 40


def test_usage_chunk_only_when_asked() -> None:
    payloads = sse_payloads(list(completion_to_sse(COMPLETION, StreamPlan(True, False))))
    assert not any(isinstance(p, dict) and "usage" in p for p in payloads)


@pytest.mark.parametrize(
    ("finish", "expected"), [("length", "length"), (None, "tool_calls"), ("", "tool_calls")]
)
def test_tool_calls_and_finish_reasons_are_replayed(finish: str | None, expected: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    completion = {
        "choices": [
            {"message": {"content": None, "tool_calls": [call, call]}, "finish_reason": finish}
        ]
    }
    chunks = sse_payloads(list(completion_to_sse(completion, StreamPlan(True, True))))[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    indexes = [d["tool_calls"][0]["index"] for d in deltas if "tool_calls" in d]
    assert indexes == [0, 1]
    assert chunks[-1]["choices"][0]["finish_reason"] == expected


def test_missing_finish_reason_without_tool_calls_is_stop() -> None:
    completion = {"choices": [{"message": {"content": "hi"}}]}
    chunks = sse_payloads(list(completion_to_sse(completion, StreamPlan(True, False))))[:-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# --- the ASGI middleware, around a recording inner app ----------------------------------------


class Inner:
    """An inner ASGI app that records what it was sent and answers with a fixed response."""

    def __init__(self, status: int = 200, body: Any = COMPLETION) -> None:
        self.status = status
        self.body = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.seen: list[tuple[MutableMapping[str, Any], bytes]] = []

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        self.seen.append((scope, message.get("body", b"")))
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": self.body})


def call(
    app: Any, body: bytes, *, path: str = "/v1/chat/completions", method: str = "POST"
) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1")],
    }
    anyio.run(app, scope, receive, send)
    start = sent[0]
    assert start["type"] == "http.response.start"
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    assert sent[-1].get("more_body", False) is False
    return start["status"], dict(start["headers"]), payload


def test_streaming_request_is_answered_as_sse_from_a_plain_call() -> None:
    inner = Inner()
    status, headers, payload = call(CompatMiddleware(inner), json.dumps(PI_REQUEST).encode())
    assert status == 200
    assert headers[b"content-type"].startswith(b"text/event-stream")
    scope, forwarded = inner.seen[0]
    sent = json.loads(forwarded)
    assert sent["stream"] is False
    assert "tools" not in sent
    assert all(isinstance(m["content"], str) for m in sent["messages"])
    assert dict(scope["headers"])[b"content-length"] == str(len(forwarded)).encode()
    events = sse_payloads([payload])
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["total_tokens"] == 43


def test_non_streaming_request_gets_the_servers_json() -> None:
    inner = Inner()
    body = json.dumps({**PI_REQUEST, "stream": False}).encode()
    status, headers, payload = call(CompatMiddleware(inner), body)
    assert status == 200
    assert headers[b"content-type"] == b"application/json"
    assert json.loads(payload) == COMPLETION


def test_server_errors_pass_through_unchanged() -> None:
    error = {"error": {"message": "Requested tokens exceed context window", "type": "x"}}
    inner = Inner(status=400, body=error)
    status, _, payload = call(CompatMiddleware(inner), json.dumps(PI_REQUEST).encode())
    assert status == 400
    assert json.loads(payload) == error


def test_other_paths_and_malformed_bodies_are_not_touched() -> None:
    inner = Inner()
    call(CompatMiddleware(inner), b"", path="/v1/models", method="GET")
    call(CompatMiddleware(inner), b"{not json")
    assert [body for _, body in inner.seen] == [b"", b"{not json"]
    assert dict(inner.seen[0][0]["headers"])[b"content-length"] == b"1"
