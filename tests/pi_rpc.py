"""The real pi in RPC mode on one session file, driven directly (no tether harness), to make
session files the way pi itself writes them: prompts, steering, its own compactions.

    with PiRpc(session_file, cfg, "rev", tmp) as pi:
        pi.prompt("hello")            # waits for agent_settled
        pi.command("compact")         # waits for the response
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tether.config import Config
from tether.pi.agentdir import write_agent_dir
from tether.pi.install import find_pi, pi_argv

__all__ = ["PiRpc"]


class PiRpc:
    def __init__(self, session_file: Path, cfg: Config, agent: str, tmp: Path) -> None:
        spec = cfg.agent(agent)
        pi = find_pi()
        agent_dir = write_agent_dir(tmp / f"agent-{time.monotonic_ns()}", cfg, agent)
        argv = pi_argv(
            pi,
            session_file=session_file,
            provider=spec.provider,
            model=spec.model,
            effort=spec.effort,
            tools=spec.tools,
            system_prompt=spec.system_prompt,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("PI_")}
        env.update(agent_dir.env)
        env.update(PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        env["PATH"] = f"{pi.node_bin_dir}{os.pathsep}{env.get('PATH', '')}"
        work = tmp / "work"
        work.mkdir(exist_ok=True)
        self._log = (tmp / "pi-rpc.log").open("ab")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=work, env=env
        )
        self.records: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._ids = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # binary: split on b"\n" only
            try:
                self.records.put(json.loads(line))
            except ValueError:
                continue
        self.records.put(None)

    def send(self, kind: str, **fields: Any) -> str:
        self._ids += 1
        rid = f"t{self._ids}"
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"id": rid, "type": kind, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        return rid

    def wait(self, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"pi did not answer; last records: {self.seen[-5:]}")
            try:
                rec = self.records.get(timeout=left)
            except queue.Empty:
                continue
            if rec is None:
                raise RuntimeError(f"pi exited ({self.proc.wait()}); last: {self.seen[-5:]}")
            self.seen.append(rec)
            if pred(rec):
                return rec

    def command(self, kind: str, timeout: float = 60.0, **fields: Any) -> dict[str, Any]:
        rid = self.send(kind, **fields)
        rec = self.wait(lambda r: r.get("type") == "response" and r.get("id") == rid, timeout)
        if not rec.get("success"):
            raise RuntimeError(f"pi refused {kind}: {rec}")
        return rec

    def settled(self, timeout: float = 60.0) -> None:
        self.wait(lambda r: r.get("type") == "agent_settled", timeout)

    def prompt(self, text: str, timeout: float = 60.0) -> None:
        self.command("prompt", message=text)
        self.settled(timeout)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def __enter__(self) -> PiRpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
