"""The service as users run it: `tether serve` / `tether worker` as subprocesses on 127.0.0.1,
driven over real HTTP with httpx, pi real, the provider scripted (tests/provider.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from provider import Reply, ToolCall

HERE = Path(__file__).parent
ENTRY = HERE / "service_entry.py"

TOKENS = {"ana-token": "user:ana", "bob-token": "user:bob", "carl-token": "user:carl"}

LONG_TOOL = Reply(tool_calls=[ToolCall("bash", {"command": "sleep 8; echo slept"})])
"""A tool call that runs long enough for two signals to land meanwhile, on a loaded machine
too."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_config(
    tmp: Path,
    provider_url: str,
    *,
    ledger_url: str | None = None,
    extra: str = "",
    lease_s: float = 30,
    drain_s: float = 20,
    poll_s: float = 0.05,
) -> Path:
    tokens = "\n".join(f'"{digest(t)}" = "{a}"' for t, a in TOKENS.items())
    path = tmp / "tether.toml"
    path.write_text(
        f"""
[ledger]
url = "{ledger_url or f"sqlite://{tmp}/ledger.db"}"

[providers.local]
base_url = "{provider_url}"
context_window = 8192
max_tokens = 1024

[agents.rev]
provider = "local"
model = "scripted"
deadline_s = 60
workdir = "work"

[harness]
runs_dir = "runs"
pi_settings = {{ retry = {{ baseDelayMs = 20 }} }}

[custody]
lease_s = {lease_s}

[access.grants]
"user:ana" = ["repo:acme/*"]
"user:carl" = ["repo:acme/*"]

[service]
poll_s = {poll_s}
drain_s = {drain_s}
{extra}

[service.tokens]
{tokens}
"""
    )
    return path


def wait_until(
    predicate: Callable[[], object], what: str, within: float = 30, proc: Served | None = None
) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` (and the serve log) when it does
    not within ``within`` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            log = proc.output()[-3000:] if proc is not None else ""
            raise TimeoutError(f"{what}: not within {within} s\n{log}")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def auth(token: str = "ana-token") -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tether_proc(
    tmp: Path,
    *args: str,
    log: str,
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """`tether ARGS` in its own process group (so a test can signal it and what it started);
    ``env`` adds to the environment; ``preexec`` runs in the child before it starts (e.g. a
    lower open-files limit)."""
    out = (tmp / log).open("wb")
    return subprocess.Popen(
        [sys.executable, str(ENTRY), *args],
        cwd=tmp,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)]),
            **(env or {}),
        },
        start_new_session=True,
        preexec_fn=preexec,
    )


@contextlib.contextmanager
def workers(tmp: Path, config: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """A starter of ``tether worker`` processes with ``config``: ``start(log, *args)`` (its
    output in ``tmp/log``); each one started is stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(log: str, *args: str) -> subprocess.Popen[bytes]:
        started.append(tether_proc(tmp, "worker", "--config", str(config), *args, log=log))
        return started[-1]

    try:
        yield start
    finally:
        for proc in started:
            stop_proc(proc)


def stop_proc(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    client: httpx.Client
    tmp: Path
    log: str

    def output(self) -> str:
        return (self.tmp / self.log).read_text(errors="replace")

    def post(
        self, session: str, text: str, token: str = "ana-token", **body: Any
    ) -> httpx.Response:
        return self.client.post(
            f"/v1/sessions/{session}/requests",
            json={"agent": "rev", "text": text, **body},
            headers=auth(token),
        )

    def get(self, path: str, token: str = "ana-token", **params: Any) -> httpx.Response:
        return self.client.get(path, headers=auth(token), params=params)

    def relay(self, session: str, text: str, deliver: str, into: str) -> None:
        """Post ``text`` as carl with ``deliver`` (steer or follow_up): it is delivered into the
        live run ``into``."""
        posted = self.post(session, text, token="carl-token", deliver=deliver)
        assert posted.status_code == 202, posted.text
        assert (posted.json()["status"], posted.json()["run"]) == ("delivered", into), posted.json()

    def said_by_users(self, session: str = "s1") -> list[tuple[str, str]]:
        """(actor, text) of each user message among the session's rows."""
        rows = self.get(f"/v1/sessions/{session}/rows").json()["rows"]
        return [
            (r["actor"], r["message"]["content"][0]["text"])
            for r in rows
            if r["message"]["role"] == "user"
        ]

    def wait_run(self, run: str, timeout: float = 60, token: str = "ana-token") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            got = self.get(f"/v1/runs/{run}", token)
            assert got.status_code == 200, got.text
            body: dict[str, Any] = got.json()
            if body["status"] in ("finished", "failed", "interrupted"):
                return body
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run} still {body['status']}\n{self.output()[-3000:]}")
            time.sleep(0.05)


@contextlib.contextmanager
def serve(
    tmp: Path,
    config: Path,
    *,
    workers: int = 1,
    log: str = "serve.log",
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> Iterator[Served]:
    port = free_port()
    proc = tether_proc(
        tmp,
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        "--workers",
        str(workers),
        log=log,
        env=env,
        preexec=preexec,
    )
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=30)
    served = Served(proc, url, client, tmp, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if client.get("/healthz").status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tether serve did not come up:\n{served.output()}")
            time.sleep(0.05)
        yield served
    finally:
        client.close()
        stop_proc(proc)


def sse_events(
    client: httpx.Client, run: str, *, last_event_id: str | None = None, token: str = "ana-token"
) -> list[dict[str, Any]]:
    """Read a run's event stream to its end: [{"id","event","data"}, …]."""
    headers = auth(token)
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    events: list[dict[str, Any]] = []
    with client.stream("GET", f"/v1/runs/{run}/events", headers=headers, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        for line in resp.iter_lines():
            if not line:
                if "event" in current:
                    current["data"] = json.loads(current.get("data", "null"))
                    events.append(current)
                current = {}
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            current[key] = value[1:] if value.startswith(" ") else value
    return events
