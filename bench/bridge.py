"""Bridge benchmark: a message's answer through ``tether bridge matrix`` against the same request
posted to ``tether serve`` directly.

A real Synapse on 127.0.0.1 (``make synapse``; tests/support/synapse.py starts it), the real pi,
the scripted provider answering each request after ``--latency-ms``. ``--threads`` Matrix threads
each get ``--messages`` messages, one after another (the next once the last was answered), all
threads at once; the service gets the same: as many sessions, the same requests, each posted once
the last ended. The two alternate by message round, each on a ledger of its own, ``--workers``
runs at a time each.

Latency, per message: through the bridge, the answer's ``origin_server_ts`` minus the message's
(the homeserver's clock: sync, queue, view, pi, mirror, the outbox's post); directly, the run's
``ended`` in the ledger minus the moment ``POST …/requests`` was sent (this machine's clock).
Printed: p50 and p99 each way and the bridge's overhead at p50.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from provider import RecordedRequest, Reply, ScriptedProvider  # noqa: E402
from service_support import (  # noqa: E402
    Served,
    serve,
    stop_proc,
    tether_proc,
    wait_until,
    write_config,
)
from support.synapse import Homeserver, MatrixUser, bridge_toml  # noqa: E402
from tether.ledger import open_ledger  # noqa: E402

LIMITS = """
[service.limits]
queued = 1000000
live = 1000000
per_minute = 1000000
"""
"""The one actor's limits, never reached (the defaults, 60 requests a minute, would be)."""


def _service_config(tmp: Path, provider: str) -> Path:
    return write_config(tmp, provider, extra=LIMITS)


def _bridge_config(tmp: Path, provider: str, hs: Homeserver, bot: MatrixUser, room: str) -> Path:
    config = _service_config(tmp, provider)
    with config.open("a") as f:
        f.write(
            bridge_toml(hs, bot, [room], token_env="BENCH_MATRIX_TOKEN", settings="poll_s = 0.05")
        )
    return config


def _events(hs: Homeserver, user: MatrixUser, room: str) -> list[dict[str, Any]]:
    """Every message event of ``room``, oldest first."""
    out: list[dict[str, Any]] = []
    start: str | None = None
    while True:
        params: dict[str, Any] = {"dir": "b", "limit": 1000, **({"from": start} if start else {})}
        got = hs.client.get(
            f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/messages",
            params=params,
            headers={"Authorization": f"Bearer {user.token}"},
        ).json()
        out += [e for e in got["chunk"] if e.get("type") == "m.room.message"]
        start = got.get("end")
        if not got["chunk"] or not start:
            return list(reversed(out))


def _thread_of(event: dict[str, Any]) -> str:
    relation = (event.get("content") or {}).get("m.relates_to") or {}
    return str(relation.get("event_id") or event["event_id"])


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _stats(name: str, values: list[float]) -> float:
    ordered = sorted(values)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"  {name:8} p50 {p50 * 1000:7.0f} ms   p99 {p99 * 1000:7.0f} ms   ({len(values)})")
    return p50


def _bridge_round(
    hs: Homeserver, ana: MatrixUser, bot: MatrixUser, room: str, roots: list[str], k: int, n: int
) -> list[str]:
    """Message ``k`` in each of the ``n`` threads at once (the first starts them, mentioning the
    bot), then wait for their answers; the threads' roots."""
    with ThreadPoolExecutor(n) as pool:
        if k == 0:
            texts = [f"question 0 of thread {t}" for t in range(n)]
            roots = list(pool.map(lambda text: ana.send(room, text, mention=bot), texts))
        else:
            asked = [(f"question {k} of thread {t}", roots[t]) for t in range(n)]
            list(pool.map(lambda q: ana.send(room, q[0], thread=q[1]), asked))

    def answered() -> bool:
        mine = [e for e in _events(hs, ana, room) if e["sender"] == bot.user_id]
        return len(mine) >= n * (k + 1)

    wait_until(answered, f"round {k}'s answers", 600)
    return roots


def _direct_round(s: Served, ledger_url: str, k: int, n: int) -> list[float]:
    """The same requests to the service, one session a thread, all at once: their latencies
    (to the run's end as the ledger has it)."""

    def ask(t: int) -> tuple[str, float]:
        sent = time.time()
        posted = s.post(f"bench-{t}", f"question {k} of thread {t}")
        run = str(posted.json()["run"])
        s.wait_run(run, timeout=600)
        return run, sent

    with ThreadPoolExecutor(n) as pool:
        runs = list(pool.map(ask, range(n)))
    with open_ledger(ledger_url) as led:
        return [_epoch(str(led.get_run(r).ended)) - sent for r, sent in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    delay = args.latency_ms / 1000

    def reply(req: RecordedRequest) -> Reply:
        return Reply(f"answer to {req.last_user_text}", delay_s=delay)

    work = Path(tempfile.mkdtemp(prefix="tether-bench-bridge-"))
    print(
        f"{args.threads} threads × {args.messages} messages, {args.workers} workers each way, "
        f"provider latency {args.latency_ms:.0f} ms (work dir {work})",
        flush=True,
    )
    hs = Homeserver.start(work / "synapse")
    bot, ana = hs.register("tether"), hs.register("ana")
    room = ana.create_room(invite=[bot.user_id])
    bridged: list[float] = []
    direct: list[float] = []
    with ScriptedProvider(reply) as provider:
        (work / "bridge").mkdir()
        (work / "serve").mkdir()
        config = _bridge_config(work / "bridge", provider.url, hs, bot, room)
        ledger_url = f"sqlite://{work / 'bridge'}/ledger.db"
        served_url = f"sqlite://{work / 'serve'}/ledger.db"
        proc = tether_proc(
            work / "bridge",
            *("bridge", "matrix", "--config", str(config), "--workers", str(args.workers)),
            log="bridge.log",
            env={"BENCH_MATRIX_TOKEN": bot.token},
        )

        def synced() -> bool:
            with open_ledger(ledger_url) as led:
                return led.bridge_cursor(f"matrix:{bot.user_id}") is not None

        try:
            wait_until(synced, "the bridge's first sync", 120)
            with serve(
                work / "serve",
                _service_config(work / "serve", provider.url),
                workers=args.workers,
            ) as s:
                roots: list[str] = []
                for k in range(args.messages):
                    roots = _bridge_round(hs, ana, bot, room, roots, k, args.threads)
                    direct += _direct_round(s, served_url, k, args.threads)
                    print(f"round {k + 1} of {args.messages} done", flush=True)
            kept = _events(hs, ana, room)
        finally:
            stop_proc(proc)
            hs.stop()
    by_thread: dict[str, list[dict[str, Any]]] = {}
    for e in kept:
        by_thread.setdefault(_thread_of(e), []).append(e)
    for thread in by_thread.values():
        asked = [e for e in thread if e["sender"] != bot.user_id]
        answers = [e for e in thread if e["sender"] == bot.user_id]
        for q, a in zip(asked, answers, strict=False):
            bridged.append((a["origin_server_ts"] - q["origin_server_ts"]) / 1000)
    b50 = _stats("bridge", bridged)
    d50 = _stats("direct", direct)
    print(f"  the bridge's overhead at p50: {b50 / d50 - 1:+.1%}")


if __name__ == "__main__":
    main()
