"""The scripted model of ``tether eval continuation --scripted``: deterministic, for CI.

A small OpenAI-compatible chat-completions server on 127.0.0.1 (streamed answers with usage, as
pi expects). It is no language model; it plays three fixed parts, so that what the evaluation
measures is tether's pipeline (what reaches the next run), never a model's skill:

- **the agent**: for a request marked ``[eval run K]`` it makes the tool calls of run K's plan,
  one per turn (the count of tool results since the request says which is next), then answers
  ``Audit step K done.``;
- **the summarizer**: pi's summary request (its "context summarization assistant" prompt) gets
  :data:`SUMMARY`, a given text that carries none of the planted facts;
- **the reader**: a probe (``[eval probe]``) is answered line by line with the answer of every
  fact whose needle occurs in the request it was sent (its context); with recall allowed
  (``[eval probe recall]``) it first calls ``recall`` once for each range its context names
  (``recall({"from":A,"to":B})``), at most :data:`MAX_RECALLS`, then answers the same way.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tether.eval.workspace import Fact, Step

__all__ = ["MAX_RECALLS", "MODEL", "SUMMARY", "ScriptedModel"]

MODEL = "tether-eval-scripted"
SUMMARY = (
    "## Goal\nAudit the repository as the user asked.\n\n"
    "## Progress\n- Read the handlers, the release notes and the build logs.\n"
    "- Ran the check scripts; some of them failed.\n\n"
    "## Next steps\n- Report the failures and the decisions the user stated."
)
"""The scripted summarizer's text: it names no path, SHA, command, error, number or ticket."""
MAX_RECALLS = 8
SUMMARY_MARK = "context summarization assistant"
_RUN = re.compile(r"\[eval run (\d+)\]")
_RECALL = re.compile(r'recall\(\{"from":(\d+),"to":(\d+)\}\)')


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


class ScriptedModel:
    """``with ScriptedModel(plans, facts) as model: model.url``"""

    def __init__(self, plans: Sequence[Sequence[Step]], facts: Sequence[Fact] = ()) -> None:
        self.plans = [list(p) for p in plans]
        self.facts = list(facts)
        self.requests = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_case(self, plans: Sequence[Sequence[Step]], facts: Sequence[Fact]) -> None:
        """The plans and facts of the seed being evaluated (one server serves every seed)."""
        with self._lock:
            self.plans = [list(p) for p in plans]
            self.facts = list(facts)

    # -- the three parts ------------------------------------------------------------------------

    def answer(self, body: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        """(text, tool calls) for one request."""
        with self._lock:
            self.requests += 1
            plans, facts = self.plans, self.facts
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        system = "\n".join(
            _text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")
        )
        if SUMMARY_MARK in system:
            return SUMMARY, []
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        request = _text(messages[last_user].get("content")) if last_user >= 0 else ""
        done = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
        if (found := _RUN.search(request)) is not None:
            k = int(found.group(1))
            plan = plans[k - 1] if 0 < k <= len(plans) else []
            if len(done) < len(plan):
                step = plan[len(done)]
                return "", [(step.tool, step.arguments)]
            return f"Audit step {k} done.", []
        if "[eval probe" in request:
            context = json.dumps(messages[:last_user], ensure_ascii=False) + "\n".join(
                _text(m.get("content")) for m in messages[last_user + 1 :]
            )
            if "[eval probe recall]" in request and len(done) < MAX_RECALLS:
                named = "\n".join(_text(m.get("content")) for m in messages[:last_user])
                ranges = list(dict.fromkeys(_RECALL.findall(named)))
                if len(done) < len(ranges):
                    a, b = ranges[len(done)]
                    return "", [("recall", {"from": int(a), "to": int(b)})]
            lines = []
            for i, fact in enumerate(facts, start=1):
                known = fact.needle in context or json.dumps(fact.needle)[1:-1] in context
                lines.append(f"{i}. {fact.expected if known else 'unknown'}")
            return "\n".join(lines), []
        return "I have nothing scripted for this request.", []


def _chunk(cid: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            data = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            self._send(200, "application/json", data.encode())

        def _send(self, status: int, kind: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, "application/json", b'{"error":{"message":"not JSON"}}')
                return
            text, calls = model.answer(body)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            cid = f"chatcmpl-{model.requests}"
            events = [_chunk(cid, {"role": "assistant", "content": ""})]
            if text:
                events.append(_chunk(cid, {"content": text}))
            for i, (name, args) in enumerate(calls):
                call = {
                    "index": i,
                    "id": f"call_{model.requests}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                events.append(_chunk(cid, {"tool_calls": [call]}))
            events.append(_chunk(cid, {}, "tool_calls" if calls else "stop"))
            prompt = max(1, len(raw) // 4)
            completion = max(1, (len(text) + sum(len(json.dumps(a)) for _, a in calls)) // 4)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            events.append({**_chunk(cid, {}), "choices": [], "usage": usage})
            try:
                for event in events:
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler
