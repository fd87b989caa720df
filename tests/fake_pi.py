"""A stand-in for pi's RPC mode that misbehaves on purpose (``FAKE_PI_MODE``).

Run as ``python fake_pi.py <pi's arguments>``; it reads commands from stdin like pi does.

- ``garbage``: writes lines that are not RPC records around a started prompt, then exits.
- ``flood``: accepts the prompt, then writes non-protocol lines until it is stopped.
- ``deaf``: accepts the prompt and never settles; ``abort`` gets no answer.
- ``dialog``: asks a blocking ``select`` dialog, then settles with the dialog's answer as text.
- ``crash``: writes a diagnostic to stderr and exits 1 before reading anything.
- ``stubborn``: settles the prompt at once, then ignores the end of stdin and SIGTERM (only
  SIGKILL ends it), so closing it takes every grace period the harness allows.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def out(record: dict[str, object] | str) -> None:
    line = record if isinstance(record, str) else json.dumps(record)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def started(cid: object) -> dict[str, object]:
    """pi's answer to a prompt it took."""
    return {
        "id": cid,
        "type": "response",
        "command": "prompt",
        "success": True,
        "data": {"disposition": "started"},
    }


def commands():  # type: ignore[no-untyped-def]
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def settle(text: str) -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stopReason": "stop",
        "timestamp": int(time.time() * 1000),
    }
    out({"type": "agent_start"})
    out({"type": "turn_start"})
    out({"type": "message_end", "message": message})
    out({"type": "agent_end", "messages": [message], "willRetry": False})
    out({"type": "agent_settled", "aborted": False})


def main() -> int:
    mode = os.environ.get("FAKE_PI_MODE", "garbage")
    if mode == "crash":
        sys.stderr.write("fake pi: cannot start: the configuration is broken\n")
        return 1
    for cmd in commands():
        kind, cid = cmd.get("type"), cmd.get("id")
        if kind != "prompt":
            if mode != "deaf":
                out({"id": cid, "type": "response", "command": kind, "success": True})
            continue
        if mode == "garbage":
            out("this is not json")
            out(started(cid))
            out("[1, 2, 3]")
            out('{"no_type": true}')
            sys.stdout.write('{"type": "agent_start"')  # cut mid-record
            sys.stdout.flush()
            return 0
        out(started(cid))
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            settle("all done")
            for other in commands():
                out(
                    {
                        "id": other.get("id"),
                        "type": "response",
                        "command": other.get("type"),
                        "success": True,
                    }
                )
            time.sleep(120)
            return 0
        if mode == "flood":
            while True:
                out("garbage " * 8)
                time.sleep(0.001)
        if mode == "deaf":
            out({"type": "agent_start"})
            for _ in commands():
                pass  # ignores abort and everything else
            return 0
        if mode == "dialog":
            out(
                {
                    "type": "extension_ui_request",
                    "id": "ui-1",
                    "method": "select",
                    "title": "Allow?",
                    "options": ["Allow", "Block"],
                }
            )
            out(
                {
                    "type": "extension_ui_request",
                    "id": "ui-2",
                    "method": "notify",
                    "message": "heads up",
                    "notifyType": "warning",
                }
            )
            for answer in commands():
                if answer.get("type") == "extension_ui_response" and answer.get("id") == "ui-1":
                    settle("dialog answer: " + json.dumps(answer, sort_keys=True))
                    break
            for _ in commands():
                pass
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
