"""The follow-up view after an erasure (docs/contracts.md#the-follow-up-view,
docs/operations.md#erasure-and-retention), as a property: whatever rows an
erasure takes and whatever the budget, a gap named ``erased`` holds only seqs that no longer
exist, no seq that no longer exists is shown, every seq is accounted for, and when the reads
reach every row, every missing seq is named ``erased`` and nothing else is a gap."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.config import FollowupConfig
from tether.followup import FollowupView, GapWhy, build_view
from tether.ledger import Ledger, NewRow, RunStatus, open_ledger
from tether.ledger.lifecycle import Selector, SelectorKind

AGENT = "rev"


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1}


# A turn: (request carries repo:x, [(answer size, answer carries repo:x)]).
turns = st.lists(
    st.tuples(
        st.booleans(),
        st.lists(st.tuples(st.integers(10, 400), st.booleans()), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=8,
)


def _write(ledger: Ledger, plan: list[tuple[bool, list[tuple[int, bool]]]]) -> None:
    ledger.ensure_session("s1")
    for i, (secret_request, answers) in enumerate(plan):
        fence = ledger.claim_run(ledger.create_run("s1", AGENT).id)
        ledger.append(
            fence,
            [
                NewRow.message(
                    "user:ana",
                    _msg("user", f"ask {i}"),
                    sources=("repo:x",) if secret_request else (),
                )
            ],
            request=True,
        )
        ledger.append(
            fence,
            [
                NewRow.message(
                    f"agent:{AGENT}",
                    _msg("assistant", f"answer {i} " + "z" * size),
                    sources=("repo:x",) if secret else (),
                )
                for size, secret in answers
            ],
        )
        ledger.end_run(fence, RunStatus.FINISHED)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=turns, budget=st.integers(1_500, 20_000))
def test_erased_gaps_name_exactly_the_seqs_that_are_gone(
    plan: list[tuple[bool, list[tuple[int, bool]]]], budget: int
) -> None:
    with open_ledger("memory:") as ledger:
        _write(ledger, plan)
        last = ledger.last_seq("s1")
        ledger.erase(Selector(SelectorKind.SOURCE, "repo:x"), actor="user:op")
        present = {r.seq for r in ledger.iter_rows("s1")}
        for size in (budget, 10_000_000):
            view = build_view(
                ledger,
                session="s1",
                agent=AGENT,
                actor="user:ana",
                request="and now?",
                config=FollowupConfig(budget_bytes=size),
                grants={"user:ana": ["*"]},
            )
            if not isinstance(view, FollowupView):
                continue  # the protected context alone did not fit this budget
            assert view.bytes <= size
            in_gap: dict[int, GapWhy] = {}
            for g in view.gaps:
                for s in range(g.first, g.last + 1):
                    assert s not in in_gap
                    in_gap[s] = g.why
            shown = {m.origin for m in view.messages if m.origin is not None}
            if view.previous_request is not None:
                shown.add(view.previous_request.seq)
            assert not shown & (set(range(1, last + 1)) - present), "an erased seq is shown"
            erased = {s for s, why in in_gap.items() if why is GapWhy.ERASED}
            assert not erased & present, "a row that exists is named erased"
            # Every seq is accounted for: shown, or in a gap.
            assert set(range(1, last + 1)) <= shown | set(in_gap)
            if size == 10_000_000:
                # The reads reach every row: every missing seq is erased, nothing else is a gap.
                assert erased == set(range(1, last + 1)) - present
                assert set(in_gap) == erased
