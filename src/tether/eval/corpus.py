"""``tether eval continuation --corpus DIR``: real pi sessions, scored with no model.

DIR holds pi session files (``NAME.jsonl``, as pi writes them) and beside each its facts
(``NAME.facts.jsonl``), one JSON object a line::

    {"id":"f1","question":"Which commit was v1.2 built from?","quote":"0f6b…","entry":"a1b2c3d4"}

``quote`` is the exact evidence, ``entry`` the id of the session entry it comes from. Each
session is imported into the evaluation's own ledger, then closed by a continuation checkpoint
made without a model: its summary is :data:`tether.eval.scripted.SUMMARY` (it names no fact) and
its anchors are the real extension's (``extension/js/anchors.js`` under pi's node), bound by the
agent's ``anchors_max_bytes``. The next view is built at the budget, and each fact is scored as
seen (its entry holds the quote: else the facts file is wrong, named among the problems),
available (by part) and recoverable (one recall call the view names returns it).
"""

from __future__ import annotations

import io
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.errors import ConfigError
from tether.eval.score import score_view, share
from tether.eval.scripted import SUMMARY
from tether.eval.workspace import Fact, FactKind
from tether.files import private_dir
from tether.followup import FollowupView, build_view
from tether.interop import import_pi
from tether.ledger import RowKind, open_ledger
from tether.ledger.jsonl import dump_session, load_lines
from tether.mirror.entries import anchors_with_seqs
from tether.pi.install import extension_file, find_pi
from tether.recall import read_range

__all__ = ["CorpusFact", "evaluate_corpus", "read_facts"]

ACTOR = "user:eval"
ANCHORS_JS = extension_file("anchors")


@dataclass(frozen=True)
class CorpusFact:
    id: str
    question: str
    quote: str
    entry: str

    def fact(self) -> Fact:
        return Fact(self.id, FactKind.QUOTE, self.quote, self.question, self.quote)


def read_facts(path: Path) -> list[CorpusFact]:
    """The facts file, checked: every line an object with the four string fields."""
    facts: list[CorpusFact] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc})") from None
        fields = ("id", "question", "quote", "entry")
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in fields):
            raise ConfigError(f"{path}:{n}: a fact needs the strings {', '.join(fields)}")
        if not item["quote"]:
            raise ConfigError(f"{path}:{n}: the quote is empty")
        facts.append(CorpusFact(*(item[k] for k in fields)))
    return facts


def extract_anchors(node: Path, entries: list[dict[str, Any]], max_bytes: int) -> Any:
    """The extension's own extraction (anchors.js) over pi's entries."""
    script = (
        f"import {{ extractAnchors }} from {json.dumps(ANCHORS_JS.resolve().as_uri())};\n"
        "let s = ''; process.stdin.on('data', (d) => (s += d));\n"
        "process.stdin.on('end', () => { const a = JSON.parse(s);\n"
        "  process.stdout.write(JSON.stringify(extractAnchors(a.branch, a.max))); });\n"
    )
    done = subprocess.run(
        [str(node), "--input-type=module", "-e", script],
        input=json.dumps({"branch": entries, "max": max_bytes}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def _entries(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # pi skips what it cannot parse
        if isinstance(entry, dict) and entry.get("type") != "session":
            out.append(entry)
    return out


def _checkpointed(ledger: Any, session: str, copy: str, compaction: dict[str, Any]) -> None:
    """``session`` again as ``copy``, closed by the compaction row ``compaction``."""

    out = io.StringIO()
    dump_session(ledger, session, out)
    lines = []
    last = 0
    for line in out.getvalue().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "session":
            rec["id"] = copy
        else:
            rec["session"] = copy
        if rec.get("type") == "run":
            rec["id"] = f"{rec['id']}-{copy}"
        elif rec.get("run"):
            rec["run"] = f"{rec['run']}-{copy}"
        if rec.get("type") == "row":
            last = max(last, int(rec["seq"]))
        lines.append(rec)
    lines.append(
        {
            "type": "row",
            "session": copy,
            "seq": last + 1,
            "run": None,
            "actor": "agent:eval",
            "sources": [],
            "compaction": compaction,
        }
    )
    load_lines(ledger, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode())


def evaluate_corpus(
    corpus: Path, out: Path, *, agent: str, budget: int, anchors_max_bytes: int
) -> dict[str, Any]:
    """Score every session of ``corpus`` (the record's ``corpus`` shape, docs/cli.md)."""
    sessions = sorted(p for p in corpus.glob("*.jsonl") if not p.name.endswith(".facts.jsonl"))
    if not sessions:
        raise ConfigError(f"{corpus} holds no pi session file (NAME.jsonl)")
    private_dir(out)
    for leftover in out.glob("corpus.db*"):
        leftover.unlink()
    node = find_pi().node
    ledger = open_ledger(f"sqlite:{out / 'corpus.db'}")
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    flags: dict[str, list[bool]] = {"seen": [], "available": [], "recoverable": [], "a_or_r": []}
    try:
        for i, path in enumerate(sessions, start=1):
            facts_path = path.with_name(path.name[: -len(".jsonl")] + ".facts.jsonl")
            if not facts_path.exists():
                problems.append(f"{path.name}: no facts file ({facts_path.name})")
                continue
            facts = read_facts(facts_path)
            session = f"corpus-{i}"
            import_pi(ledger, path, session=session, agent=agent, actor=ACTOR)
            rows = list(ledger.iter_rows(session))
            seq_of = {r.entry_id: r.seq for r in rows if r.entry_id}
            covers = max((r.seq for r in rows), default=0)
            anchors = extract_anchors(node, _entries(path), anchors_max_bytes)
            compaction = {
                "summary": SUMMARY,
                "continuation": {"version": 1, "run": "corpus"},
                "covers_to": covers,
                "tokens_before": 0,
                "details": {
                    "continuation": {"version": 1, "run": "corpus"},
                    "anchors": anchors_with_seqs(anchors, seq_of.get, covers),
                },
            }
            copy = f"{session}-next"
            _checkpointed(ledger, session, copy, compaction)
            view = build_view(
                ledger, session=copy, agent=agent, actor=ACTOR, budget=budget, grants={}
            )
            if not isinstance(view, FollowupView):
                problems.append(f"{path.name}: the view was refused ({view.reason.value})")
                continue

            def recall(first: int, last: int, copy: str = copy) -> str:
                return read_range(ledger, copy, first, last, actor=ACTOR, grants={}).to_text()

            scores = score_view(view, [f.fact() for f in facts], recall)
            by_entry = {r.entry_id: r for r in rows if r.entry_id}
            scored = []
            for f, s in zip(facts, scores.facts, strict=True):
                row = by_entry.get(f.entry)
                seen = row is not None and f.quote in json.dumps(row.body, ensure_ascii=False)
                seen = seen or (
                    row is not None
                    and json.dumps(f.quote, ensure_ascii=False)[1:-1]
                    in json.dumps(row.body, ensure_ascii=False)
                )
                if not seen:
                    problems.append(f"{path.name}: fact {f.id}: entry {f.entry} does not hold it")
                flags["seen"].append(seen)
                if seen:
                    flags["available"].append(s.available)
                    if not s.available:
                        flags["recoverable"].append(s.recoverable)
                    flags["a_or_r"].append(s.available or s.recoverable)
                scored.append({**s.to_json(), "seen": seen, "entry": f.entry})
            results.append(
                {
                    "session": path.name,
                    "rows": len(rows),
                    "compactions": sum(1 for r in rows if r.kind is RowKind.COMPACTION),
                    "view_bytes": view.bytes,
                    "anchors_bytes": view.checkpoint.anchors_bytes if view.checkpoint else 0,
                    "facts": scored,
                }
            )
    finally:
        ledger.close()
    return {
        "eval": "continuation-corpus",
        "corpus": str(corpus),
        "agent": agent,
        "budget": budget,
        "anchors_max_bytes": anchors_max_bytes,
        "sessions": results,
        "facts": len(flags["seen"]),
        "seen": share(flags["seen"]),
        "available": share(flags["available"]),
        "recoverable": share(flags["recoverable"]),
        "available_or_recoverable": share(flags["a_or_r"]),
        "problems": problems,
    }


def corpus_from_eval(ledger: Any, session: str, facts: list[Fact], out: Path, name: str) -> int:
    """Write ``session`` of an evaluation's ledger (a scripted run's, say) as a corpus entry:
    ``NAME.jsonl``, the pi session file tether exports, and ``NAME.facts.jsonl``, each planted
    fact whose needle a row holds, with that row's entry id. Returns the facts written."""
    from tether.interop import export_pi

    private_dir(out)
    session_file = out / f"{name}.jsonl"
    buf = io.StringIO()
    export_pi(ledger, session, buf, cwd="/work")
    # The run's own entries, as pi had them before any checkpoint: compactions are left out
    # (their children re-linked to their parents), so the corpus checkpoint covers them all.
    parent_of: dict[str, Any] = {}
    kept = []
    for line in buf.getvalue().splitlines():
        entry = json.loads(line)
        if entry.get("type") == "compaction":
            parent_of[entry["id"]] = entry.get("parentId")
            continue
        while entry.get("parentId") in parent_of:
            entry["parentId"] = parent_of[entry["parentId"]]
        kept.append(json.dumps(entry, ensure_ascii=False))
    session_file.write_text("".join(f"{x}\n" for x in kept), encoding="utf-8")
    entries = [e for e in _entries(session_file) if isinstance(e.get("id"), str)]
    lines = []
    for fact in facts:
        quoted = json.dumps(fact.needle, ensure_ascii=False)[1:-1]
        holder = next(
            (
                e
                for e in entries
                if e.get("type") == "message"
                and quoted in json.dumps(e.get("message"), ensure_ascii=False)
            ),
            None,
        )
        if holder is None:
            continue
        item = {"id": fact.id, "question": fact.question, "quote": fact.needle}
        lines.append(json.dumps({**item, "entry": holder["id"]}, ensure_ascii=False))
    (out / f"{name}.facts.jsonl").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return len(lines)
