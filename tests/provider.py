"""A scripted OpenAI-compatible chat-completions server for tests (tests/provider.py).

pi (and anything else that speaks ``POST /v1/chat/completions``) talks to it on 127.0.0.1, on a
free port per test. A *script* decides each response:

    provider = scripted_provider([
        Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]),
        Fail(503),                                  # pi retries …
        Reply("done"),                              # … and gets this
    ])
    provider.url            # "http://127.0.0.1:PORT/v1", for models.json
    provider.requests       # every request received, in order (RecordedRequest)

A script is a sequence of steps (taken in request order), a function ``request -> step``, or a
sequence mixing both (a function item is called with the request that reaches it). When the steps
run out, the provider answers ``Fail(500, "script exhausted")`` and counts it in ``exhausted``, so
a test that sends one request too many sees it.

Steps:

- ``Reply(text, tool_calls, reasoning, finish, usage, chunk_chars, delay_s, chunk_delay_s)``:
  a streamed (SSE) completion with a final usage chunk; ``finish="length"`` for a truncated answer.
- ``Fail(status, message, headers)``: an HTTP error with an OpenAI-style JSON error body.
- ``Stall(seconds, after_chunks, text)``: a 200 SSE response that stops sending (after some
  chunks) and then closes without ``[DONE]``; ``seconds=None`` holds it until the server stops.
- ``Drop(after_chunks)``: closes the connection mid-stream.
- helpers: ``empty()``, ``truncated(text)``, ``huge(n_bytes)``, ``overflow()`` (a context-overflow
  error pi recognises), ``route(summary=…, task=…)`` (separate scripts for pi's summary requests
  and ordinary task requests).

The ``scripted_provider`` pytest fixture starts one per call and stops them all at teardown.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = [
    "Drop",
    "Fail",
    "RecordedRequest",
    "Reply",
    "ScriptedProvider",
    "Stall",
    "ToolCall",
    "empty",
    "huge",
    "overflow",
    "route",
    "scripted_provider",
    "truncated",
]

SUMMARY_MARK = "context summarization assistant"
_ids = itertools.count(1)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str
    """A dict (sent as JSON) or a raw string (sent as is, e.g. to test malformed arguments)."""
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    reasoning: str = ""
    finish: str | None = None
    """Default: ``tool_calls`` when there are tool calls, else ``stop``."""
    usage: tuple[int, int] | tuple[int, int, int, int] | None = None
    """(prompt_tokens, completion_tokens), or with (…, cached_tokens, cache_write_tokens) of the
    prompt (``prompt_tokens_details``: pi counts them as cache read and write, the rest of the
    prompt as input); default: estimated as bytes / 4."""
    chunk_chars: int = 24
    delay_s: float = 0.0
    """Wait this long before sending the response headers."""
    chunk_delay_s: float = 0.0
    model: str | None = None


@dataclass(frozen=True)
class Fail:
    status: int = 500
    message: str = "scripted provider failure"
    headers: dict[str, str] = field(default_factory=dict)
    """E.g. ``{"retry-after-ms": "10"}`` to make a client's retry fast."""


@dataclass(frozen=True)
class Stall:
    seconds: float | None = None
    """How long to hold the stream open before closing it (None: until the server stops)."""
    after_chunks: int = 0
    """Stream this many text chunks of ``text`` first."""
    text: str = "partial answer that never finishes"


@dataclass(frozen=True)
class Drop:
    after_chunks: int = 1
    text: str = "partial answer cut by a dropped connection"


Step = Reply | Fail | Stall | Drop


def empty() -> Reply:
    """A completion with no content at all."""
    return Reply(text="", finish="stop")


def truncated(text: str = "this answer was cut off by the token lim") -> Reply:
    """A completion stopped by the token limit (``finish_reason: length``)."""
    return Reply(text=text, finish="length")


def huge(n_bytes: int, *, finish: str = "stop") -> Reply:
    """A very long text completion of ``n_bytes`` ASCII bytes."""
    unit = "lorem ipsum dolor sit amet "
    text = (unit * (n_bytes // len(unit) + 1))[:n_bytes]
    return Reply(text=text, finish=finish, chunk_chars=max(24, n_bytes // 200))


def overflow() -> Fail:
    """A context-window overflow error, worded so pi's overflow detection recognises it."""
    return Fail(
        400, "Your input exceeds the context window of this model (context_length_exceeded)"
    )


@dataclass(frozen=True)
class RecordedRequest:
    index: int
    """0-based order of arrival."""
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes
    at: float
    """time.monotonic() at arrival."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        msgs = self.body.get("messages")
        return msgs if isinstance(msgs, list) else []

    @staticmethod
    def _text(content: Any) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        return ""

    @property
    def system_text(self) -> str:
        return "\n".join(
            self._text(m.get("content"))
            for m in self.messages
            if m.get("role") in ("system", "developer")
        )

    @property
    def user_texts(self) -> list[str]:
        return [self._text(m.get("content")) for m in self.messages if m.get("role") == "user"]

    @property
    def last_user_text(self) -> str:
        texts = self.user_texts
        return texts[-1] if texts else ""

    @property
    def tool_names(self) -> list[str]:
        tools = self.body.get("tools") or []
        return [t.get("function", {}).get("name", "") for t in tools if isinstance(t, dict)]

    @property
    def is_summary(self) -> bool:
        """pi's compaction summary request (system prompt of its summarization assistant)."""
        return SUMMARY_MARK in self.system_text

    def contains(self, text: str) -> bool:
        """Whether ``text`` occurs anywhere in the request body."""
        return text in self.raw.decode("utf-8", "replace")


Script = Sequence[Step | Callable[[RecordedRequest], Step]] | Callable[[RecordedRequest], Step]


def route(
    *,
    task: Script,
    summary: Script,
) -> Callable[[RecordedRequest], Step]:
    """One script for pi's summary requests and one for everything else."""
    task_pick = _picker(task)
    summary_pick = _picker(summary)
    return lambda req: summary_pick(req) if req.is_summary else task_pick(req)


def _picker(script: Script) -> Callable[[RecordedRequest], Step]:
    if callable(script):
        return script
    items = iter(list(script))
    lock = threading.Lock()

    def pick(req: RecordedRequest) -> Step:
        with lock:
            item = next(items, None)
        if item is None:
            raise _Exhausted
        return item(req) if callable(item) else item

    return pick


class _Exhausted(Exception):
    pass


class ScriptedProvider:
    """The server. Use the ``scripted_provider`` fixture, or ``with ScriptedProvider(...)``."""

    def __init__(self, script: Script, *, model: str = "scripted") -> None:
        self._pick = _picker(script)
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.exhausted = 0
        self.errors: list[str] = []
        """Exceptions raised by script functions (answered with a 500)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        # A short poll interval keeps shutdown (every test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The OpenAI base URL (``…/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def task_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if not r.is_summary]

    @property
    def summary_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_summary]

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.requests)} requests arrived, expected {n}")
            time.sleep(0.01)

    # -- called by the handler ----------------------------------------------------------------

    def _record(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> RecordedRequest:
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            body = {}
        with self._lock:
            req = RecordedRequest(
                len(self.requests), method, path, headers, body, raw, time.monotonic()
            )
            self.requests.append(req)
        return req

    def _step_for(self, req: RecordedRequest) -> Step:
        try:
            return self._pick(req)
        except _Exhausted:
            with self._lock:
                self.exhausted += 1
            return Fail(500, f"scripted provider: script exhausted at request {req.index}")
        except Exception as exc:  # a broken script function: answer, and let the test see it
            with self._lock:
                self.errors.append(repr(exc))
            return Fail(500, f"scripted provider: script raised {exc!r}")


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []


def _handler_for(provider: ScriptedProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json(
                    200, {"object": "list", "data": [{"id": provider.model, "object": "model"}]}
                )
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            req = provider._record("POST", self.path, dict(self.headers.items()), raw)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            step = provider._step_for(req)
            # The client may go away mid-answer (an abort): nothing left to answer then.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._serve(req, step)

        # -- responses ---------------------------------------------------------------------

        def _json(
            self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
        ) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, req: RecordedRequest, step: Step) -> None:
            if isinstance(step, Fail):
                self._json(
                    step.status,
                    {
                        "error": {
                            "message": step.message,
                            "type": "scripted_error",
                            "code": step.status,
                        }
                    },
                    step.headers,
                )
                return
            if isinstance(step, Reply) and step.delay_s:
                provider._stop.wait(step.delay_s)
            if not req.body.get("stream"):
                if isinstance(step, Reply):
                    self._json(200, self._completion(req, step))
                else:  # a stall or drop without streaming: hold, then cut
                    provider._stop.wait(getattr(step, "seconds", None) or 0)
                    self.close_connection = True
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            cid = f"chatcmpl-{next(_ids)}"
            if isinstance(step, Stall):
                for piece in _chunks(step.text, 8)[: step.after_chunks]:
                    self._event(self._chunk(cid, {"content": piece}))
                provider._stop.wait(step.seconds)
                return
            if isinstance(step, Drop):
                for piece in _chunks(step.text, 8)[: step.after_chunks]:
                    self._event(self._chunk(cid, {"content": piece}))
                self.connection.shutdown(2)
                return
            self._stream(req, step, cid)

        def _event(self, data: dict[str, Any] | str) -> None:
            payload = data if isinstance(data, str) else json.dumps(data)
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()

        def _chunk(
            self, cid: str, delta: dict[str, Any], finish: str | None = None
        ) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": provider.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def _usage(self, req: RecordedRequest, step: Reply) -> dict[str, Any]:
            if step.usage is not None:
                prompt, completion = step.usage[:2]
                if len(step.usage) == 4:
                    cached, written = step.usage[2:]
                    return {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                        "prompt_tokens_details": {
                            "cached_tokens": cached,
                            "cache_write_tokens": written,
                        },
                    }
            else:
                prompt = max(1, len(req.raw) // 4)
                out = len(step.text) + len(step.reasoning)
                out += sum(len(json.dumps(c.arguments)) + len(c.name) for c in step.tool_calls)
                completion = max(1, out // 4)
            return {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }

        def _finish(self, step: Reply) -> str:
            return step.finish or ("tool_calls" if step.tool_calls else "stop")

        def _call_id(self, call: ToolCall, i: int) -> str:
            return call.id or f"call_{next(_ids)}_{i}"

        def _args(self, call: ToolCall) -> str:
            return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)

        def _stream(self, req: RecordedRequest, step: Reply, cid: str) -> None:
            self._event(self._chunk(cid, {"role": "assistant", "content": ""}))
            for piece in _chunks(step.reasoning, step.chunk_chars):
                self._event(self._chunk(cid, {"reasoning_content": piece}))
                if step.chunk_delay_s:
                    provider._stop.wait(step.chunk_delay_s)
            for piece in _chunks(step.text, step.chunk_chars):
                self._event(self._chunk(cid, {"content": piece}))
                if step.chunk_delay_s:
                    provider._stop.wait(step.chunk_delay_s)
            for i, call in enumerate(step.tool_calls):
                args = self._args(call)
                head = {"index": i, "id": self._call_id(call, i), "type": "function"}
                self._event(
                    self._chunk(
                        cid,
                        {
                            "tool_calls": [
                                {**head, "function": {"name": call.name, "arguments": ""}}
                            ]
                        },
                    )
                )
                for piece in _chunks(args, step.chunk_chars):
                    self._event(
                        self._chunk(
                            cid, {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
                        )
                    )
            self._event(self._chunk(cid, {}, self._finish(step)))
            usage_chunk = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": provider.model,
                "choices": [],
                "usage": self._usage(req, step),
            }
            self._event(usage_chunk)
            self._event("[DONE]")

        def _completion(self, req: RecordedRequest, step: Reply) -> dict[str, Any]:
            message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
            if step.reasoning:
                message["reasoning_content"] = step.reasoning
            if step.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": self._call_id(c, i),
                        "type": "function",
                        "function": {"name": c.name, "arguments": self._args(c)},
                    }
                    for i, c in enumerate(step.tool_calls)
                ]
            return {
                "id": f"chatcmpl-{next(_ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": provider.model,
                "choices": [{"index": 0, "message": message, "finish_reason": self._finish(step)}],
                "usage": self._usage(req, step),
            }

    return Handler


@pytest.fixture
def scripted_provider() -> Iterator[Callable[..., ScriptedProvider]]:
    """A factory: ``scripted_provider(script, model="scripted")`` → a started provider on a free
    127.0.0.1 port; every one is stopped at teardown."""
    started: list[ScriptedProvider] = []

    def start(script: Script, *, model: str = "scripted") -> ScriptedProvider:
        p = ScriptedProvider(script, model=model).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
