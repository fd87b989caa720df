"""Two ``tether bridge matrix`` processes on one PostgreSQL ledger (docs/bridges.md): each syncs
every event, yet each event runs once and is answered once."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from pg import fresh_schema_url
from service_support import wait_until
from support.synapse import People
from test_bridge_matrix import Bridged, _room, bridged  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("matrix")]


def test_two_bridges_on_one_ledger_never_answer_one_event_twice(
    people: People,
    bridged: Callable[..., Bridged],  # noqa: F811
) -> None:
    room = _room(people)
    with fresh_schema_url() as url:
        one = bridged([room], ledger_url=url, label="one")
        first = one.ledger_call(lambda led: led.bridge_cursor(one.name))
        one.stop()  # its position is stored: the next start reads on from it
        roots = [people.ana.send(room, f"question {i}", mention=people.bot) for i in range(3)]
        two = bridged([room], ledger_url=url, label="two", start=False)
        one.start(wait=False)  # both at once, each from the stored position (or a later one)
        two.start(wait=False)
        for root in roots:
            one.wait_posts(room, root, 1)
        follow = people.bob.send(room, "and a follow-up", thread=roots[0])
        one.wait_posts(room, roots[0], 2)
        # Every event again (both bridges from the position before them; a bridge that starts
        # after the other stored a newer one reads on from there): nothing runs or posts again.
        one.stop()
        two.stop()
        one.ledger_call(lambda led: led.set_bridge_cursor(one.name, first))
        one.start(wait=False)
        two.start(wait=False)
        events = [*roots, follow]
        wait_until(
            lambda: all(f"{e} in " in one.latest_output() + two.latest_output() for e in events),
            "every event seen again",
            30,
        )
        again = one.latest_output().count(" (again)") + two.latest_output().count(" (again)")
        assert again >= 4, (one.latest_output(), two.latest_output())
        time.sleep(3)
        for i, root in enumerate(roots):
            bodies = [p["content"]["body"] for p in one.bot_posts(room, root)]
            expected = [f"**answer** to: question {i}"]
            if root == roots[0]:
                expected.append("**answer** to: and a follow-up")
            assert bodies == expected, (bodies, one.output(), two.output())
        runs = [one.ledger_call(lambda led, e=e: led.event_run(one.name, e)) for e in events]
        assert None not in runs
        assert len(set(runs)) == 4
        sessions = {one.ledger_call(lambda led, r=r: led.get_run(r).session) for r in runs}
        assert len(sessions) == 3
        made = sum(len(one.ledger_call(lambda led, s=s: led.runs(s))) for s in sessions)
        assert made == 4, "one run per event, whichever bridge queued it"
        messages = one.ledger_call(lambda led: led.bridge_messages(one.name))
        assert sorted(m.key for m in messages) == sorted(f"answer:{r}" for r in runs)
        assert all(m.state == "sent" for m in messages)
        one.stop()
        two.stop()
