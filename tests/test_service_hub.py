"""The live hub keeps no run's history: each event stream has its own bounded buffer, a slow one
is dropped from the live tail and goes on from the ledger (rows, status, end)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path
from typing import Any

import anyio

from tether.access import Admission
from tether.config import load_config
from tether.events import AnswerDelta, RowsMirrored
from tether.ledger import NewRow, RunStatus, open_ledger
from tether.service.auth import Caller
from tether.service.hub import LiveHub
from tether.service.state import ServiceState
from tether.service.stream import _Stream


def test_a_long_run_publishes_many_events_and_the_hub_holds_a_bounded_number() -> None:
    hub = LiveHub(buffer=64)
    publish = hub.publisher("r1")
    idle = hub.subscribe("r1")  # a subscriber that never reads
    tracemalloc.start()
    try:
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(50_000):
            publish(AnswerDelta(text=f"chunk {i} " + "x" * 100))
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A list of every event (the old hub) held 50,000 events, ~8 MB; a buffer holds 64.
    assert hub.held_events() <= 64
    assert after - before < 1_000_000, f"the hub kept {after - before} bytes"
    assert idle.overflowed
    assert idle.ended is False
    got = idle.take()
    assert [e.text.split()[1] for e in got if isinstance(e, AnswerDelta)] == [
        str(i) for i in range(64)
    ]
    assert idle.ended
    assert hub.subscribers("r1") == 0
    idle.close()
    assert hub.held_events() == 0


def test_a_full_buffer_drops_only_that_subscriber() -> None:
    hub = LiveHub(buffer=4)
    publish = hub.publisher("r1")
    slow, quick = hub.subscribe("r1"), hub.subscribe("r1")
    seen: list[str] = []
    for i in range(10):
        publish(AnswerDelta(text=str(i)))
        seen += [e.text for e in quick.take() if isinstance(e, AnswerDelta)]
    assert seen == [str(i) for i in range(10)], "a reader that keeps up gets every event"
    assert [e.text for e in slow.take() if isinstance(e, AnswerDelta)] == ["0", "1", "2", "3"]
    assert slow.overflowed
    assert slow.ended
    assert not quick.overflowed
    assert not quick.ended
    assert hub.subscribers("r1") == 1
    hub.done("r1")
    assert quick.take() == []
    assert quick.ended
    assert not quick.overflowed
    assert hub.live() == []
    assert hub.subscribers("r1") == 0
    slow.close()
    quick.close()


def test_an_event_with_no_subscriber_is_not_kept() -> None:
    hub = LiveHub(buffer=8)
    publish = hub.publisher("r1")
    for i in range(100):
        publish(AnswerDelta(text=str(i)))
    assert hub.live() == ["r1"]
    assert hub.held_events() == 0
    late = hub.subscribe("r1")
    assert late.take() == [], "a subscriber gets what is published after it subscribed"
    publish(AnswerDelta(text="now"))
    assert [e.text for e in late.take() if isinstance(e, AnswerDelta)] == ["now"]
    late.close()


def _config(tmp: Path) -> Any:
    path = tmp / "tether.toml"
    path.write_text(
        f"""
[ledger]
url = "sqlite://{tmp}/ledger.db"
[providers.local]
base_url = "http://127.0.0.1:9/v1"
[agents.rev]
provider = "local"
model = "m"
[service]
poll_s = 0.02
"""
    )
    return load_config(path)


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}


def test_a_stream_dropped_from_the_live_tail_still_gets_every_row_and_the_end(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    with open_ledger(cfg.ledger.url) as ledger:
        ledger.ensure_session("s1")
        run = ledger.create_run("s1", "rev", extra={"request": {"actor": "user:ana"}})
        fence = ledger.claim_run(run.id)
        st = ServiceState(config=cfg, ledger=ledger, hub=LiveHub(buffer=2))
        who = Caller(actor="user:ana", admission=Admission(cfg.access.grants, "user:ana"))
        publish = st.hub.publisher(run.id)
        events: list[tuple[str, Any]] = []

        async def main() -> None:
            stream = _Stream(st, ledger.get_run(run.id), who, 0)
            gen = stream.events()
            first = await gen.__anext__()  # subscribed, status read
            events.append((first.event, json.loads(first.data)))
            # The client stops reading while the run writes: its buffer (2) overflows.
            for i in range(10):
                publish(AnswerDelta(text=f"d{i}"))
            rows = ledger.append(
                fence,
                [NewRow.message("user:ana", _msg("user", "go"))],
                request=True,
            )
            rows += ledger.append(fence, [NewRow.message("agent:rev", _msg("assistant", "ok"))])
            publish(RowsMirrored(seqs=(2,), entry_ids=("e",), written_at=0, entry_times=(0,)))
            ledger.end_run(fence, RunStatus.FINISHED, extra={"answer": "ok"})
            st.hub.done(run.id)
            with anyio.fail_after(10):
                async for ev in gen:
                    events.append((ev.event, json.loads(ev.data)))

        anyio.run(main)
    kinds = [k for k, _ in events]
    assert kinds[0] == "status"
    texts = [d["delta"] for k, d in events if k == "text"]
    assert texts == ["d0", "d1"], "what it buffered before it was dropped, then no more"
    assert [d["seq"] for k, d in events if k == "row"] == [1, 2]
    assert kinds[-2:] == ["checkpoint", "end"]
    assert events[-1][1]["answer"] == "ok"
