"""The scripted provider itself: what it streams, records and injects."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from provider import Fail, Reply, ScriptedProvider, ToolCall, empty, overflow, route, truncated


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )


def _chat(text: str = "hi", stream: bool = True) -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}


def test_streams_text_tool_calls_and_usage(
    scripted_provider: Callable[..., ScriptedProvider],
) -> None:
    p = scripted_provider(
        [
            Reply(
                "hello there",
                tool_calls=[ToolCall("bash", {"command": "ls"}, id="c1")],
                usage=(70, 5),
            )
        ]
    )
    status, raw = _post(p.url, _chat("first"))
    assert status == 200
    events = _events(raw)
    assert events[-1] == "[DONE]"
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )
    assert text == "hello there"
    args = "".join(
        tc["function"].get("arguments", "")
        for e in events[:-1]
        if e["choices"]
        for tc in e["choices"][0]["delta"].get("tool_calls", [])
    )
    assert json.loads(args) == {"command": "ls"}
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert finishes[-1] == "tool_calls"
    assert events[-2]["usage"] == {"prompt_tokens": 70, "completion_tokens": 5, "total_tokens": 75}
    assert [r.last_user_text for r in p.requests] == ["first"]


def test_faults_and_exhaustion(scripted_provider: Callable[..., ScriptedProvider]) -> None:
    p = scripted_provider([Fail(503, "busy"), overflow(), truncated("cut"), empty()])
    assert _post(p.url, _chat())[0] == 503
    status, raw = _post(p.url, _chat())
    assert status == 400
    assert "exceeds the context window" in json.loads(raw)["error"]["message"]
    events = _events(_post(p.url, _chat())[1])
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "length"
    events = _events(_post(p.url, _chat())[1])
    assert not any(e["choices"][0]["delta"].get("content") for e in events[:-1] if e["choices"])
    assert _post(p.url, _chat())[0] == 500
    assert p.exhausted == 1
    assert len(p.requests) == 5


def test_route_separates_summary_requests(
    scripted_provider: Callable[..., ScriptedProvider],
) -> None:
    p = scripted_provider(route(task=[Reply("task answer")], summary=[Reply("the summary")]))
    summary = {
        "model": "m",
        "stream": False,
        "messages": [
            {"role": "system", "content": "You are a context summarization assistant."},
            {"role": "user", "content": "<conversation>…</conversation>"},
        ],
    }
    status, raw = _post(p.url, summary)
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == "the summary"
    events = _events(_post(p.url, _chat())[1])
    assert (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        == "task answer"
    )
    assert [r.is_summary for r in p.requests] == [True, False]
    assert len(p.summary_requests) == 1
    assert len(p.task_requests) == 1


def test_function_script_sees_the_request(
    scripted_provider: Callable[..., ScriptedProvider],
) -> None:
    p = scripted_provider(lambda req: Reply(f"echo {req.last_user_text}"))
    events = _events(_post(p.url, _chat("ping"))[1])
    assert (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        == "echo ping"
    )
