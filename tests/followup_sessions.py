"""Writing realistic sessions for the follow-up tests: pi-shaped AgentMessages appended through
the real ledger API (fenced runs), or imported in bulk for long sessions.

Also the tests' own byte count (docs/contracts.md#byte-accounting), written independently of
``tether.sizes``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from tether.ledger import Fence, Ledger, NewRow, Note, Row, RowKind, Run, RunStatus, Session

T = TypeVar("T")

__all__ = [
    "BudgetUse",
    "Chooser",
    "RandomChooser",
    "RunWriter",
    "Sketch",
    "assistant",
    "budget_use",
    "calls_message",
    "pi_like",
    "pick",
    "size_of",
    "tool_result",
    "user",
]

USAGE = {
    "input": 10,
    "output": 5,
    "cacheRead": 0,
    "cacheWrite": 0,
    "totalTokens": 15,
    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
}


def size_of(message: Any) -> int:
    """UTF-8 length of the canonical JSON (sorted keys, no spaces) with every base64 image
    payload replaced by its length: the tests' own count, not tether's."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            if value.get("type") == "image" and isinstance(value.get("data"), str):
                return {k: (len(v) if k == "data" else v) for k, v in value.items()}
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    text = json.dumps(strip(message), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8"))


def user(text: str, *, ts: int = 1, image: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image", "data": image, "mimeType": "image/png"})
    return {"role": "user", "content": content, "timestamp": ts}


def assistant(text: str, *, ts: int = 1, usage: dict[str, Any] = USAGE) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "api": "openai-completions",
        "provider": "local",
        "model": "m",
        "usage": usage,
        "stopReason": "stop",
        "timestamp": ts,
    }


def calls_message(calls: list[tuple[str, str, dict[str, Any]]], *, ts: int = 1) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "toolCall", "id": cid, "name": name, "arguments": args}
            for cid, name, args in calls
        ],
        "api": "openai-completions",
        "provider": "local",
        "model": "m",
        "usage": USAGE,
        "stopReason": "toolUse",
        "timestamp": ts,
    }


def tool_result(
    call_id: str, name: str, text: str, *, ts: int = 1, image: str | None = None
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image", "data": image, "mimeType": "image/jpeg"})
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": name,
        "content": content,
        "isError": False,
        "timestamp": ts,
    }


@dataclass
class RunWriter:
    """One run written through the fenced API, the way the harness's mirror writes it."""

    ledger: Ledger
    session: str
    agent: str
    fence: Fence
    rows: list[Row] = field(default_factory=list)
    ts: int = 1_764_410_400_000

    @classmethod
    def start(
        cls,
        ledger: Ledger,
        session: str = "s1",
        agent: str = "reviewer",
        *,
        run_id: str | None = None,
    ) -> RunWriter:
        ledger.ensure_session(session)
        run = ledger.create_run(session, agent, run_id=run_id)
        return cls(ledger, session, agent, ledger.claim_run(run.id))

    def _tick(self) -> int:
        self.ts += 1000
        return self.ts

    def add(self, actor: str, message: dict[str, Any], *, sources: tuple[str, ...] = ()) -> Row:
        [row] = self.ledger.append(self.fence, [NewRow.message(actor, message, sources=sources)])
        self.rows.append(row)
        return row

    def request(self, text: str, *, actor: str = "user:ana", image: str | None = None) -> Row:
        msg = user(text, ts=self._tick(), image=image)
        [row] = self.ledger.append(self.fence, [NewRow.message(actor, msg)], request=True)
        self.rows.append(row)
        return row

    def say(self, text: str, *, sources: tuple[str, ...] = ()) -> Row:
        return self.add(f"agent:{self.agent}", assistant(text, ts=self._tick()), sources=sources)

    def calls(self, *calls: tuple[str, str, dict[str, Any]], sources: tuple[str, ...] = ()) -> Row:
        msg = calls_message(list(calls), ts=self._tick())
        return self.add(f"agent:{self.agent}", msg, sources=sources)

    def result(
        self,
        call_id: str,
        text: str,
        *,
        name: str = "read",
        sources: tuple[str, ...] = (),
        image: str | None = None,
    ) -> Row:
        msg = tool_result(call_id, name, text, ts=self._tick(), image=image)
        return self.add(f"tool:{name}", msg, sources=sources)

    def receipt(self, reason: str = "truncated") -> Row:
        body = {"kind": "continuation_checkpoint_refused", "run": self.fence.run, "reason": reason}
        [row] = self.ledger.append(
            self.fence, [NewRow(f"agent:{self.agent}", RowKind.RECEIPT, body)]
        )
        self.rows.append(row)
        return row

    def compaction(self, summary: str, covers_to: int, *, continuation: bool = False) -> Row:
        body: dict[str, Any] = {"summary": summary, "covers_to": covers_to, "tokens_before": 1}
        if continuation:
            body["continuation"] = {"version": 1, "run": self.fence.run}
        [row] = self.ledger.append(
            self.fence, [NewRow(f"agent:{self.agent}", RowKind.COMPACTION, body)]
        )
        self.rows.append(row)
        return row

    def checkpoint(self, summary: str) -> Row:
        """A continuation checkpoint: it covers every row before it."""
        return self.compaction(summary, self.ledger.last_seq(self.session), continuation=True)

    def end(self, status: RunStatus = RunStatus.FINISHED) -> None:
        self.ledger.end_run(self.fence, status)


def bulk_session(
    ledger: Ledger,
    session: str,
    rows: int,
    *,
    checkpoint_every: int | None = 10,
    agent: str = "reviewer",
    result_bytes: int = 600,
    final_calls: int = 300,
) -> None:
    """A long session imported in one transaction: runs of ten rows (a request, a call and its
    result, two parallel calls and their results, an answer, a receipt or a note-worthy remark,
    …), a continuation checkpoint after every ``checkpoint_every``-th run (None: only one, after
    the first run, so it lies far outside any tail), notes, and a last, long, interrupted run
    of ``final_calls`` calls.

    ``rows`` is rounded up to whole runs. The newest runs look the same whatever ``rows`` is,
    so two sessions of different lengths must cost a follow-up the same reads."""
    source = ("repo:acme/api",)
    out: list[Row] = []
    runs: list[Run] = []
    seq = 0
    ts = 1_764_410_400_000

    def add(
        run: str, actor: str, kind: RowKind, body: dict[str, Any], src: tuple[str, ...] = ()
    ) -> int:
        nonlocal seq
        seq += 1
        out.append(Row(session, seq, run, actor, kind, body, src, 0))
        return seq

    i = 0
    while seq < rows:
        n = f"{i:07d}"  # fixed width: runs cost the same bytes wherever they sit
        rid = f"{session}-r{n}"
        ts += 60_000
        req = add(rid, "user:ana", RowKind.MESSAGE, user(f"request {n}: review change {n}", ts=ts))
        add(
            rid,
            f"agent:{agent}",
            RowKind.MESSAGE,
            calls_message([(f"a{n}", "read", {"path": f"f{n}.py"})], ts=ts),
            source,
        )
        add(
            rid,
            "tool:read",
            RowKind.MESSAGE,
            tool_result(f"a{n}", "read", "x" * result_bytes, ts=ts),
            source,
        )
        add(
            rid,
            f"agent:{agent}",
            RowKind.MESSAGE,
            calls_message(
                [(f"b{n}", "bash", {"command": "ls"}), (f"c{n}", "bash", {"command": "git log"})],
                ts=ts,
            ),
            source,
        )
        add(
            rid,
            "tool:bash",
            RowKind.MESSAGE,
            tool_result(f"b{n}", "bash", "y" * result_bytes, ts=ts),
            source,
        )
        add(
            rid,
            "tool:bash",
            RowKind.MESSAGE,
            tool_result(f"c{n}", "bash", "z" * result_bytes, ts=ts),
            source,
        )
        add(
            rid,
            f"agent:{agent}",
            RowKind.MESSAGE,
            assistant(f"finding {n}: " + "f" * 200, ts=ts),
            source,
        )
        add(rid, "user:ana", RowKind.MESSAGE, user(f"and the tests for change {n}?", ts=ts))
        add(rid, f"agent:{agent}", RowKind.MESSAGE, assistant(f"tests {n} pass", ts=ts), source)
        if (checkpoint_every is None and i == 0) or (
            checkpoint_every and i % checkpoint_every == checkpoint_every - 1
        ):
            body = {
                "summary": f"checkpoint after run {n}: " + "s" * 2000,
                "covers_to": seq,
                "continuation": {"version": 1, "run": rid},
                "tokens_before": 70_000,
            }
            add(rid, f"agent:{agent}", RowKind.COMPACTION, body, source)
        else:
            add(
                rid,
                f"agent:{agent}",
                RowKind.RECEIPT,
                {"kind": "continuation_checkpoint_refused", "run": rid, "reason": "truncated"},
            )
        runs.append(Run(rid, session, agent, RunStatus.FINISHED, request_seq=req))
        i += 1
    # The newest run: long (far over any budget after its request) and interrupted, its last
    # call without a result.
    rid = f"{session}-final"
    req = add(rid, "user:ana", RowKind.MESSAGE, user("final request: audit every module", ts=ts))
    for k in range(final_calls):
        cid = f"final{k:05d}"
        call = calls_message([(cid, "read", {"path": f"m{k:05d}.py"})], ts=ts)
        add(rid, f"agent:{agent}", RowKind.MESSAGE, call, source)
        if k < final_calls - 1:
            add(
                rid,
                "tool:read",
                RowKind.MESSAGE,
                tool_result(cid, "read", "w" * 300, ts=ts),
                source,
            )
    runs.append(Run(rid, session, agent, RunStatus.INTERRUPTED, request_seq=req))
    notes = [
        Note(session, agent, f"note {k}: ana prefers diffs", f"2026-11-29T10:0{k}:00Z")
        for k in range(3)
    ]
    ledger.import_records([Session(session, "2026-11-29T10:00:00Z")], runs, out, notes)


# -- sessions shaped like pi's real ones ---------------------------------------------------------


class Chooser(Protocol):
    """Where a generated session's choices come from: hypothesis's ``draw`` in the property
    suite, a seeded :class:`random.Random` in the benchmark."""

    def integer(self, lo: int, hi: int) -> int: ...


class RandomChooser:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.random.randint(lo, hi)


def pick(ch: Chooser, options: Sequence[T]) -> T:
    return options[ch.integer(0, len(options) - 1)]


class Sketch:
    """A session being generated: rows as dicts (seq = index + 1), runs, notes."""

    def __init__(self, session: str = "s") -> None:
        self.session = session
        self.rows: list[dict[str, Any]] = []
        self.runs: list[Run] = []
        self.notes: list[Note] = []

    def seq(self) -> int:
        """The seq the next row gets."""
        return len(self.rows) + 1

    def add(
        self,
        run: str | None,
        actor: str,
        kind: RowKind,
        body: dict[str, Any],
        sources: tuple[str, ...] = (),
    ) -> int:
        self.rows.append(
            {
                "seq": self.seq(),
                "run": run,
                "actor": actor,
                "kind": kind,
                "body": body,
                "sources": sources,
            }
        )
        return len(self.rows)

    def seal(self) -> None:
        """What the ledger does at write time: a compaction carries the sources it covers."""
        for row in self.rows:
            if row["kind"] is RowKind.COMPACTION:
                union = set(row["sources"])
                for below in self.rows[: row["body"]["covers_to"]]:
                    union.update(below["sources"])
                row["sources"] = tuple(sorted(union))

    def records(self) -> tuple[list[Session], list[Run], list[Row], list[Note]]:
        rows = [
            Row(self.session, r["seq"], r["run"], r["actor"], r["kind"], r["body"], r["sources"], 0)
            for r in self.rows
        ]
        return [Session(self.session, "2026-11-29T10:00:00Z")], self.runs, rows, self.notes


# Tool output sizes in thousandths of the budget: mostly small, a heavy tail up to pi's own cap
# (read and bash output are cut at 50 KB, about a fifth of the 240,000-byte budget).
_RESULT_SIZES = (1, 1, 2, 3, 3, 5, 8, 8, 12, 20, 30, 45, 80, 120, 208)


def _text(n: int, fill: str) -> str:
    return (fill * max(n, 1))[: max(n, 1)]


def pi_like(
    sk: Sketch,
    ch: Chooser,
    *,
    budget: int,
    agents: Sequence[str],
    runs: int,
    sources: Sequence[tuple[str, ...]] = (("repo:a/x",),),
    ts: int = 1_764_410_400_000,
) -> None:
    """Append runs shaped like pi's real sessions: each opens with the prompt snapshot pi
    records (a ``system`` message of several kilobytes), then the request, then a long
    tool-heavy turn (batches of one to three calls, their results, few user messages: an
    occasional steer), and an answer; an interrupted run leaves its last calls without results.
    pi's own compactions happen mid-run when the context since the last one passes its window
    (covering the rows before the first kept user or assistant message,
    docs/contracts.md#compaction-rows); a finished run of
    a long working view may end in a continuation checkpoint, or its refusal receipt.

    Sizes scale with ``budget``; ``agents[0]`` runs most of the time."""
    k = max(budget // 1000, 1)  # a thousandth of the budget
    window = budget * pick(ch, (2, 3, 4))  # pi's context window, in view bytes
    keep = budget // pick(ch, (3, 5))  # what pi keeps after compacting
    since = 0  # bytes in pi's context since the last compaction
    covered = 0  # the last seq a compaction covers
    calls = 0
    for _ in range(runs):
        rid = f"{sk.session}-r{len(sk.runs)}"
        agent = agents[0] if ch.integer(0, 3) else pick(ch, agents)
        actor = f"agent:{agent}"
        status = pick(ch, (RunStatus.FINISHED,) * 5 + (RunStatus.INTERRUPTED, RunStatus.FAILED))
        run_start = sk.seq()
        given: set[str] = set()
        ts += 60_000

        def put(
            who: str,
            body: dict[str, Any],
            src: tuple[str, ...] = (),
            *,
            rid: str = rid,
            given: set[str] = given,
        ) -> int:
            nonlocal since
            given.update(src)
            size = size_of(body)
            since += size
            return sk.add(rid, who, RowKind.MESSAGE, body, src)

        if ch.integer(0, 4):
            prompt = {
                "role": "system",
                "content": "",
                "sections": {"preamble": _text(k * pick(ch, (8, 20, 40)), "p")},
                "toolsAdded": [{"name": "read", "description": "Read a file", "parameters": {}}],
                "timestamp": ts,
            }
            sk.add(rid, actor, RowKind.MESSAGE, prompt)
        request = put(
            "user:ana", user(f"task {rid}: " + _text(k * pick(ch, (1, 2, 5, 20)), "q"), ts=ts)
        )
        steps = ch.integer(1, 30)
        for step in range(steps):
            ts += 1000
            if ch.integer(0, 19) == 0:
                put("user:ana", user("steer: " + _text(k * pick(ch, (1, 3)), "v"), ts=ts))
            batch = []
            for _ in range(pick(ch, (1, 1, 1, 2, 3))):
                calls += 1
                batch.append((f"call{calls}", pick(ch, ("read", "bash", "edit")), {"n": calls}))
            src = tuple(sorted(given))
            put(actor, calls_message(batch, ts=ts), src)
            last_step = step == steps - 1
            for j, (cid, name, _args) in enumerate(batch):
                if last_step and status is RunStatus.INTERRUPTED and j >= len(batch) - 1:
                    break  # the run was cut while this call ran
                out = pick(ch, sources) if name != "edit" else ()
                size = k * pick(ch, _RESULT_SIZES)
                put(f"tool:{name}", tool_result(cid, name, _text(size, "r"), ts=ts), out)
            if since > window:
                # pi compacts on its own: it keeps the newest rows from a user or assistant
                # message about ``keep`` bytes back, and summarizes what lies before.
                kept, cut = 0, None
                for row in reversed(sk.rows[covered:]):
                    if row["kind"] is not RowKind.MESSAGE:
                        continue
                    kept += size_of(row["body"])
                    if row["body"].get("role") in ("user", "assistant"):
                        cut = row["seq"]
                        if kept >= keep:
                            break
                if cut is None or cut - 1 <= covered:
                    continue
                covers = covered = cut - 1
                summary = "pi summary: " + _text(k * pick(ch, (5, 15, 30)), "c")
                sk.add(
                    rid,
                    actor,
                    RowKind.COMPACTION,
                    {"summary": summary, "covers_to": covers, "tokens_before": since // 4},
                )
                since = kept
        if status is RunStatus.FINISHED:
            ts += 1000
            put(actor, assistant("answer: " + _text(k * pick(ch, (1, 3, 8)), "a"), ts=ts))
            work = sum(size_of(r["body"]) for r in sk.rows[run_start - 1 :])
            if work > budget and ch.integer(0, 1):
                body: dict[str, Any] = {
                    "summary": "checkpoint: " + _text(k * pick(ch, (10, 25, 50)), "k"),
                    "covers_to": sk.seq() - 1,
                    "continuation": {"version": 1, "run": rid},
                    "tokens_before": work // 4,
                }
                sk.add(rid, actor, RowKind.COMPACTION, body)
                since, covered = 0, sk.seq() - 2
            elif work > budget and ch.integer(0, 1):
                reason = pick(ch, ("truncated", "empty", "over_bound"))
                receipt = {"kind": "continuation_checkpoint_refused", "run": rid, "reason": reason}
                sk.add(rid, actor, RowKind.RECEIPT, receipt)
        sk.runs.append(Run(rid, sk.session, agent, status, request_seq=request))


# -- how well a view uses its budget ---------------------------------------------------------


def _opens(row: dict[str, Any]) -> bool:
    body = row["body"]
    if row["kind"] is not RowKind.MESSAGE or body.get("role") != "user":
        return False
    content = body.get("content")
    if isinstance(content, str):
        return bool(content.strip())
    return any(
        isinstance(b, dict) and b.get("type") == "text" and str(b.get("text", "")).strip()
        for b in content or []
    )


@dataclass(frozen=True)
class BudgetUse:
    fill: float
    """bytes ÷ budget."""
    limit: str
    """What stopped the view: "nothing omitted", "next exchange" (the newest omitted complete
    exchange does not fit the space left), or "next unit" (a long turn's next batch does not)."""
    free: int
    next_bytes: int
    """Stored size of what the view would take next (0 when nothing is omitted)."""

    @property
    def ok(self) -> bool:
        """The done criterion of issue 11: fill ≥ 95 %, or limited only by the next complete
        exchange not fitting."""
        return self.fill >= 0.95 or self.limit in ("nothing omitted", "next exchange")


def budget_use(
    view: dict[str, Any], fetch: Callable[[int, int], Sequence[Row]], last_seq: int
) -> BudgetUse:
    """How ``view`` (the ``tether context --json`` shape) uses its budget; ``fetch(first, last)``
    reads stored rows (everything admitted), ``last_seq`` is the session's newest seq. Reads
    only back from the view's first carried row to the opening of the exchange before it."""
    budget, size = view["budget"], view["bytes"]
    free = budget - size
    origins = sorted(m["origin"] for m in view["messages"] if m["origin"] is not None)
    cp = view.get("checkpoint")
    covers = cp["covers_to"] if cp else 0
    req = view.get("previous_request")
    budget_gaps = [g for g in view["gaps"] if g["why"] == "budget" and g["to"] > covers]
    if not budget_gaps:
        return BudgetUse(size / budget, "nothing omitted", free, 0)
    # What the view would take next: before its oldest carried row when rows there were left
    # out (the exchange ending there, when that row opens one; else the unit), otherwise the
    # unit before the newest range left out among the carried rows.
    floor = covers
    start = min((s for s in origins if s > covers), default=last_seq + 1)
    if not any(g["from"] < start for g in budget_gaps):
        newest = budget_gaps[-1]["to"]
        floor = max(s for s in [covers, *origins] if s < newest)
        start = min((s for s in origins if s > newest), default=last_seq + 1)
    del req

    def as_dict(row: Row) -> dict[str, Any]:
        return {"seq": row.seq, "kind": row.kind, "body": row.body}

    opens = start <= last_seq and _opens(as_dict(fetch(start, start)[0]))
    piece: list[dict[str, Any]] = []
    hi = start - 1
    while hi > floor:
        lo = max(floor + 1, hi - 199)
        page = [as_dict(r) for r in fetch(lo, hi)]
        piece = page + piece
        hi = lo - 1
        if opens and any(_opens(r) for r in page):
            break
        if not opens and any(r["body"].get("role") != "toolResult" for r in page):
            break
    if opens:
        first = next((i for i in range(len(piece) - 1, -1, -1) if _opens(piece[i])), 0)
        piece, kind = piece[first:], "next exchange"
    else:
        last = piece[-1:]
        if last and last[0]["body"].get("role") == "toolResult":
            cid = last[0]["body"].get("toolCallId")
            for i in range(len(piece) - 1, -1, -1):
                content = piece[i]["body"].get("content")
                if isinstance(content, list) and any(
                    isinstance(b, dict) and b.get("id") == cid for b in content
                ):
                    last = piece[i:]
                    break
        piece, kind = last, "next unit"
    return BudgetUse(size / budget, kind, free, sum(size_of(r["body"]) for r in piece))
