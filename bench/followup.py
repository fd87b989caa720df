"""Follow-up view benchmark: the time to build the next run's view as a session grows, and how
much of its budget the view uses.

For sessions of 10^3 … 10^6 rows on SQLite (a file ledger, WAL), it times ``build_view`` and
prints largest : smallest (the target is ≤ 1.5: the view's cost must not grow with the session),
with the budget fill (bytes ÷ budget) of the view for the agent that did the work (``reviewer``)
and for another agent (``auditor``, no runs of its own), and what limits it. Two shapes: the
newest run far over the budget (its request is placed first, the newest rows after it follow),
and a short newest run (ordinary reuse: the window reaches back over earlier runs). In the same
run it times a baseline that loads the whole transcript and then trims it to the budget (what
pi's session loading and the OpenAI Agents SDK's SQLiteSession do), and prints
baseline : tether at 10^5 rows. Then sessions like pi's real ones (tests/followup_sessions.py:
long tool-heavy turns, few user messages, pi's own compactions mid-run, prompt snapshots), one
per seed, each with a history over the budget: fill and build time for both agents.

    .venv/bin/python bench/followup.py            # 10^3, 10^4, 10^5, 10^6 rows
    .venv/bin/python bench/followup.py --quick    # 10^3, 10^4, 10^5 rows

Every bulk session has the same recent shape: runs of ten rows (request, a call and its result,
two parallel calls and their results, answers; a continuation checkpoint after every tenth run),
then the newest, interrupted run (300 calls, or 12).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from followup_sessions import BudgetUse, RandomChooser, Sketch, budget_use, pi_like  # noqa: E402
from tether.followup import FollowupView, build_view  # noqa: E402
from tether.ledger import (  # noqa: E402
    Ledger,
    Note,
    Row,
    RowKind,
    Run,
    RunStatus,
    Session,
    open_ledger,
)

BUDGET = 240_000
AGENT = "reviewer"
OTHER = "auditor"
SHAPES = {"long newest run": 300, "short newest run": 12}
SOURCE = ("repo:acme/api",)
USAGE = {"input": 1200, "output": 40, "totalTokens": 1240}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}


def _say(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stopReason": "stop",
        "usage": USAGE,
        "timestamp": 1,
    }


def _calls(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "toolCall", "id": c, "name": "read", "arguments": {"path": f"src/{c}.py"}}
            for c in ids
        ],
        "stopReason": "toolUse",
        "usage": USAGE,
        "timestamp": 1,
    }


def _result(cid: str, size: int) -> dict[str, Any]:
    text = f"def {cid}(x):\n    return x\n" * (size // 28)
    return {
        "role": "toolResult",
        "toolCallId": cid,
        "toolName": "read",
        "content": [{"type": "text", "text": text}],
        "isError": False,
        "timestamp": 1,
    }


def session_records(
    session: str, rows: int, final_calls: int = 300
) -> tuple[list[Run], Iterator[Row]]:
    """The runs (a list) and the rows (streamed, so 10^6 of them never sit in memory)."""
    regular = rows // 10
    runs = [
        Run(f"{session}-r{i}", session, AGENT, RunStatus.FINISHED, request_seq=i * 10 + 1)
        for i in range(regular)
    ]
    runs.append(
        Run(f"{session}-final", session, AGENT, RunStatus.INTERRUPTED, request_seq=regular * 10 + 1)
    )

    def stream() -> Iterator[Row]:
        seq = 0

        def row(run: str, actor: str, kind: RowKind, body: dict[str, Any], src: Any = ()) -> Row:
            nonlocal seq
            seq += 1
            return Row(session, seq, run, actor, kind, body, tuple(src), 0)

        for i in range(regular):
            rid = f"{session}-r{i}"
            n = f"{i:07d}"
            yield row(rid, "user:ana", RowKind.MESSAGE, _user(f"request {n}: review change {n}"))
            yield row(rid, f"agent:{AGENT}", RowKind.MESSAGE, _calls(f"a{n}"), SOURCE)
            yield row(rid, "tool:read", RowKind.MESSAGE, _result(f"a{n}", 600), SOURCE)
            yield row(rid, f"agent:{AGENT}", RowKind.MESSAGE, _calls(f"b{n}", f"c{n}"), SOURCE)
            yield row(rid, "tool:read", RowKind.MESSAGE, _result(f"b{n}", 600), SOURCE)
            yield row(rid, "tool:read", RowKind.MESSAGE, _result(f"c{n}", 600), SOURCE)
            yield row(rid, f"agent:{AGENT}", RowKind.MESSAGE, _say(f"finding {n}: " + "f" * 200))
            yield row(rid, "user:ana", RowKind.MESSAGE, _user(f"and the tests for {n}?"))
            yield row(rid, f"agent:{AGENT}", RowKind.MESSAGE, _say(f"tests {n} pass"))
            if i % 10 == 9:
                body = {
                    "summary": f"checkpoint after run {n}: " + "s" * 4000,
                    "covers_to": seq,
                    "continuation": {"version": 1, "run": rid},
                }
                # The ledger's write path stores the union of the covered rows' sources here.
                yield row(rid, f"agent:{AGENT}", RowKind.COMPACTION, body, SOURCE)
            else:
                receipt = {"kind": "continuation_checkpoint_refused", "run": rid, "reason": "empty"}
                yield row(rid, f"agent:{AGENT}", RowKind.RECEIPT, receipt)
        rid = f"{session}-final"
        yield row(rid, "user:ana", RowKind.MESSAGE, _user("final request: audit every module"))
        for k in range(final_calls):
            cid = f"final{k:05d}"
            yield row(rid, f"agent:{AGENT}", RowKind.MESSAGE, _calls(cid), SOURCE)
            if k < final_calls - 1:
                yield row(rid, "tool:read", RowKind.MESSAGE, _result(cid, 1200), SOURCE)

    return runs, stream()


def build(ledger: Ledger, session: str, rows: int, final_calls: int = 300) -> None:
    runs, stream = session_records(session, rows, final_calls)
    notes = [
        Note(session, AGENT, f"note {k}: ana prefers diffs", "2026-11-29T10:00:00Z")
        for k in range(3)
    ]
    ledger.import_records([Session(session, "2026-11-29T10:00:00Z")], runs, stream, notes)


def tether_view(ledger: Ledger, session: str, agent: str = AGENT) -> FollowupView:
    view = build_view(
        ledger,
        session=session,
        agent=agent,
        actor="user:ana",
        budget=BUDGET,
        grants={"user:ana": ["repo:*"]},
    )
    assert isinstance(view, FollowupView), view
    return view


def baseline_view(ledger: Ledger, session: str) -> list[Row]:
    """Load the whole transcript, then keep the newest rows that fit the budget."""
    rows = list(ledger.iter_rows(session))
    kept: list[Row] = []
    total = 0
    for row in reversed(rows):
        if row.kind is not RowKind.MESSAGE:
            continue
        if total + row.bytes > BUDGET:
            break
        total += row.bytes
        kept.append(row)
    kept.reverse()
    return kept


def timed(fns: dict[int, Callable[[], object]], repeat: int) -> dict[int, float]:
    """Median wall time of each function over ``repeat`` rounds, after a warm-up call. Rounds
    interleave the functions, so load from elsewhere on the machine falls on all of them."""
    samples: dict[int, list[float]] = {key: [] for key in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeat):
        for key, fn in fns.items():
            gc.collect()  # one call's garbage is not charged to the next
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in samples.items()}


def use_of(ledger: Ledger, session: str, view: FollowupView) -> BudgetUse:
    def fetch(first: int, last: int) -> list[Row]:
        return ledger.rows_range(session, first, last, limit=last - first + 1)

    return budget_use(view.to_json(), fetch, ledger.last_seq(session))


def shown(use: BudgetUse) -> str:
    return f"fill {use.fill:6.1%} ({use.limit}{'' if use.ok else ', NOT ok'})"


def pi_sessions(tmp: Path, seeds: int, repeat: int) -> list[bool]:
    """Sessions like pi's real ones, one per seed; those whose history exceeds the budget."""
    oks: list[bool] = []
    for seed in range(seeds):
        sk = Sketch(f"pi{seed}")
        pi_like(
            sk,
            RandomChooser(seed),
            budget=BUDGET,
            agents=[AGENT, "other"],
            runs=12,
            sources=(("repo:acme/api",),),
        )
        sk.seal()
        url = f"sqlite://{tmp}/pi{seed}.db"
        with open_ledger(url) as ledger:
            ledger.import_records(*sk.records())
            history = sum(r.bytes for r in ledger.iter_rows(sk.session))
            if history <= BUDGET:
                print(f"pi-like seed {seed:2}: history {history:,} bytes fits the budget; skipped")
                continue
            parts = []
            for agent in (AGENT, OTHER):
                view = tether_view(ledger, sk.session, agent)
                use = use_of(ledger, sk.session, view)
                took = timed({0: functools.partial(tether_view, ledger, sk.session, agent)}, repeat)
                mode = view.previous_request.mode.value if view.previous_request else "none"
                parts.append(f"{agent} {shown(use)}, request {mode}, {took[0] * 1000:5.2f} ms")
                if agent == AGENT:
                    oks.append(use.ok)
            print(
                f"pi-like seed {seed:2}: {len(sk.rows):5,} rows, history {history:>9,} bytes; "
                + "; ".join(parts),
                flush=True,
            )
    return oks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="stop at 10^5 rows")
    parser.add_argument("--repeat", type=int, default=30, help="timed rounds")
    parser.add_argument("--seeds", type=int, default=12, help="pi-like sessions")
    args = parser.parse_args()
    sizes = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6]

    with tempfile.TemporaryDirectory(prefix="tether-bench-followup-") as tmp:
        ledgers: dict[tuple[str, int], Ledger] = {}
        try:
            for shape, final_calls in SHAPES.items():
                for n in sizes:
                    url = f"sqlite://{Path(tmp)}/s{final_calls}-{n}.db"
                    start = time.perf_counter()
                    with open_ledger(url) as ledger:
                        build(ledger, f"s{n}", n, final_calls)
                    print(
                        f"built {n:>9,} + {final_calls * 2} rows ({shape}) in "
                        f"{time.perf_counter() - start:5.1f} s",
                        flush=True,
                    )
                    ledgers[shape, n] = open_ledger(url)
            results = {}
            for shape in SHAPES:
                views = {n: tether_view(ledgers[shape, n], f"s{n}") for n in sizes}
                others = {n: tether_view(ledgers[shape, n], f"s{n}", OTHER) for n in sizes}
                tether = timed(
                    {n: functools.partial(tether_view, ledgers[shape, n], f"s{n}") for n in sizes},
                    args.repeat,
                )
                uses = {n: use_of(ledgers[shape, n], f"s{n}", views[n]) for n in sizes}
                other_uses = {n: use_of(ledgers[shape, n], f"s{n}", others[n]) for n in sizes}
                results[shape] = (views, tether, uses, other_uses)
            # The baseline at 10^5 rows, interleaved with tether on the same session.
            base = ledgers["long newest run", 10**5]
            pair = timed(
                {
                    0: functools.partial(baseline_view, base, "s100000"),
                    1: functools.partial(tether_view, base, "s100000"),
                },
                5,
            )
            kept = baseline_view(base, "s100000")
        finally:
            for ledger in ledgers.values():
                ledger.close()

        oks: list[bool] = []
        for shape, (views, tether, uses, other_uses) in results.items():
            print(f"-- {shape}")
            for n in sizes:
                view = views[n]
                mode = view.previous_request.mode.value if view.previous_request else "none"
                oks.append(uses[n].ok)
                print(
                    f"{n:>9,} rows: tether {tether[n] * 1000:6.2f} ms (median of {args.repeat}); "
                    f"{AGENT}: {view.bytes:,} bytes, {shown(uses[n])}, request {mode}, "
                    f"gaps {[(g.first, g.last) for g in view.gaps]}; "
                    f"{OTHER}: {shown(other_uses[n])}"
                )
            largest, smallest = max(sizes), min(sizes)
            growth = tether[largest] / tether[smallest]
            print(
                f"tether at {largest:,} : at {smallest:,} rows = {growth:.2f} "
                f"(target ≤ 1.5: {'met' if growth <= 1.5 else 'NOT met'})"
            )
        print(
            f"at 100,000 rows: baseline (load all, trim to {len(kept)} rows) "
            f"{pair[0] * 1000:.0f} ms, tether {pair[1] * 1000:.2f} ms; "
            f"baseline : tether = {pair[0] / pair[1]:.0f}"
        )
        print("-- sessions like pi's (history over the budget)")
        oks += pi_sessions(Path(tmp), args.seeds, max(args.repeat // 3, 3))
    print(
        f"{AGENT} (the agent that did the work): fill ≥ 95 % or limited only by the next "
        f"complete exchange on {sum(oks)} of {len(oks)} sessions"
    )


if __name__ == "__main__":
    main()
