"""Erasure and retention (docs/operations.md#erasure-and-retention): what a selector removes,
worked out once
(:meth:`LifecycleSql.plan_erasure`, which ``--dry-run`` prints) and removed in one transaction
with the same plan (:meth:`LifecycleSql.erase`), leaving a receipt that holds no content.

What goes, for ``--source SRC``:

- every row whose sources include SRC (a row carries the union of the sources of what its run
  was given, so an answer derived from an erased row goes with it);
- every row of a run whose request row goes (the answers to an erased request), and that run's
  record;
- every compaction row of an affected session that covers an erased row (it summarizes it): the
  next view reads no checkpoint there and names the omitted range as a gap;
- every note whose sources include SRC;
- the answer, view and error kept in the record of a run that wrote an erased row.

For ``--session S``: the session, its rows, runs (queued ones included) and notes.

The full-text index follows the rows (SQLite's triggers, PostgreSQL's index on the row). On
SQLite the connection runs with ``secure_delete`` (freed pages are zeroed), and an erasure merges
the FTS5 index (``optimize``: deleted entries leave its segments) and truncates the WAL.
"""

from __future__ import annotations

import datetime
import enum
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from tether.errors import AlreadyExists, NotFound, SessionBusy, UsageError
from tether.files import DISCARDED_DIR
from tether.ids import check_id
from tether.ledger import codec
from tether.ledger.base import Engine, SqlBase
from tether.ledger.codec import Cursor
from tether.ledger.lineage import MAX_DEPTH, lineage
from tether.ledger.models import ENDED_STATUSES, Session, now_iso
from tether.sizes import canonical_json

if TYPE_CHECKING:
    from tether.ledger.roles import Lifecycle

__all__ = [
    "SCRUBBED_RUN_KEYS",
    "ErasePlan",
    "Erased",
    "Erasure",
    "LifecycleSql",
    "Selector",
    "SelectorKind",
    "apply_retention",
    "erase_selected",
]

# What a run's record may hold of its rows' text: dropped when the rows go.
SCRUBBED_RUN_KEYS = ("answer", "view", "error", "request")


class SelectorKind(enum.Enum):
    """What an erasure selects."""

    SESSION = "session"
    SOURCE = "source"
    ROW = "row"
    """One row (``SESSION#SEQ``) and what derives from it: a chat message its sender took back
    (a Matrix redaction, tether.bridges)."""


class Selector(msgspec.Struct, frozen=True):
    kind: SelectorKind
    value: str

    @classmethod
    def row(cls, session: str, seq: int) -> Selector:
        return cls(SelectorKind.ROW, f"{session}#{seq}")

    def to_json(self) -> dict[str, str]:
        return {self.kind.value: self.value}


class ErasePlan(msgspec.Struct):
    """Exactly what an erasure removes (``--dry-run`` prints it; :meth:`LifecycleSql.erase`
    removes it). Ids only, never content."""

    selector: Selector
    sessions: list[str] = msgspec.field(default_factory=list)
    """Sessions removed whole."""
    rows: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """Seqs of the rows removed, by session (sessions removed whole included)."""
    checkpoints: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """Of :attr:`rows`, the compaction rows, by session."""
    notes: list[int] = msgspec.field(default_factory=list)
    runs: list[str] = msgspec.field(default_factory=list)
    """Run records removed (their runs' directories go too)."""
    scrubbed_runs: list[str] = msgspec.field(default_factory=list)
    """Run records kept, without the answer, view and error they held (their directories go)."""
    queued: list[str] = msgspec.field(default_factory=list)
    """Of :attr:`runs`, the queued requests."""

    @property
    def affected_sessions(self) -> list[str]:
        return sorted(set(self.rows) | set(self.sessions))

    @property
    def run_dirs(self) -> list[str]:
        """The runs whose directories go (they hold pi's session files, which quote rows)."""
        return sorted(set(self.runs) | set(self.scrubbed_runs))

    def counts(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "rows": sum(len(v) for v in self.rows.values()),
            "checkpoints": sum(len(v) for v in self.checkpoints.values()),
            "notes": len(self.notes),
            "runs": len(self.runs),
            "scrubbed_runs": len(self.scrubbed_runs),
            "queued": len(self.queued),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "selector": self.selector.to_json(),
            "counts": self.counts(),
            "sessions": self.sessions,
            "rows": {s: seqs for s, seqs in sorted(self.rows.items())},
            "checkpoints": {s: seqs for s, seqs in sorted(self.checkpoints.items())},
            "notes": self.notes,
            "runs": self.runs,
            "scrubbed_runs": self.scrubbed_runs,
            "queued": self.queued,
        }


class Erasure(msgspec.Struct, frozen=True):
    """An erasure receipt: when, by whom, the selector, the counts. No content."""

    id: int
    at: str
    actor: str
    selector: dict[str, str]
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "actor": self.actor,
            "selector": self.selector,
            "counts": self.counts,
        }


def _holds(sources_json: str, source: str) -> bool:
    return source in json.loads(sources_json)


class LifecycleSql(SqlBase):
    """Forks, erasure, its receipts, and the idle sessions retention erases."""

    def fork_session(
        self, session_id: str, at_run: str, new_id: str, *, created: str | None = None
    ) -> Session:
        """A new session ``new_id`` that begins as ``session_id`` up to the end of ``at_run``,
        by reference (:mod:`tether.ledger.lineage`): a few indexed reads and one insert,
        whatever the session's length. The fork's custody, checkpoints and notes are its own
        from then on; the session forked is unchanged."""
        check_id("session", new_id)
        made = Session(id=new_id, created=created or now_iso())
        try:
            with self._tx() as c:
                self._fork(c, session_id, at_run, made)
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise AlreadyExists(f"session {new_id!r} already exists") from exc
            raise
        return made

    def _fork(self, c: Cursor, session_id: str, at_run: str, made: Session) -> None:
        c.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,))
        if c.fetchone() is None:
            raise NotFound(f"no session {session_id!r}; `tether sessions` lists them")
        segments = lineage(c, session_id)
        if segments[-1].depth >= MAX_DEPTH:
            raise UsageError(
                f"session {session_id!r} is a fork {MAX_DEPTH} levels deep; fork a session "
                "nearer its origin, or copy it (`tether ledger copy`)"
            )
        c.execute("SELECT session, ord, status, ended FROM runs WHERE id = ?", (at_run,))
        run = c.fetchone()
        if run is None:
            raise NotFound(f"no run {at_run!r}; `tether log --session {session_id}` lists them")
        seg = next((s for s in segments if s.session == run[0] and int(run[1]) <= s.max_ord), None)
        if seg is None:
            raise UsageError(f"run {at_run} is not a run of session {session_id}")
        if run[2] not in {s.value for s in ENDED_STATUSES}:
            raise UsageError(f"run {at_run} is {run[2]}; fork at a run that has ended")
        c.execute("SELECT seq FROM rows WHERE run = ? ORDER BY seq DESC LIMIT 1", (at_run,))
        last = c.fetchone()
        if last is None:
            raise UsageError(f"run {at_run} wrote no rows; fork at a run that did")
        fork_seq = int(last[0])
        # The notes of the view written by the end of the run: note ids grow with time (as
        # runs' ords do), so the newest of them is a bound on ids for every level.
        fork_note = 0
        for s in segments:
            c.execute(
                "SELECT max(id) FROM notes WHERE session = ? AND id <= ? AND at <= ?",
                (s.session, s.max_note, run[3] or ""),
            )
            found = c.fetchone()
            if found and found[0] is not None:
                fork_note = max(fork_note, int(found[0]))
        c.execute(
            "INSERT INTO sessions (id, created, extra, last_seq, parent, fork_seq, fork_ord, "
            "fork_note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                made.id,
                made.created,
                canonical_json(made.extra),
                fork_seq,
                session_id,
                fork_seq,
                int(run[1]),
                fork_note,
            ),
        )

    def fork_of(self, session_id: str) -> tuple[str, int] | None:
        """The session a fork was made from and the last seq it inherits (None: not a fork)."""
        with self._read() as c:
            c.execute("SELECT parent, fork_seq FROM sessions WHERE id = ?", (session_id,))
            r = c.fetchone()
        return (r[0], int(r[1])) if r and r[0] is not None else None

    def _source_filter(self) -> str:
        # A cheap prefilter on the stored JSON (the exact test is _holds, in Python): a source
        # appears in a row's canonical JSON list as its JSON string.
        return "instr(sources, ?) > 0" if self.engine is Engine.SQLITE else "strpos(sources, ?) > 0"

    def plan_erasure(self, selector: Selector) -> ErasePlan:
        """What erasing ``selector`` removes now (nothing is written)."""
        with self._read() as c:
            return self._plan(c, selector)

    def _plan(self, c: Cursor, selector: Selector) -> ErasePlan:
        plan = ErasePlan(selector)
        if selector.kind is SelectorKind.SESSION:
            check_id("session", selector.value)
            s = selector.value
            c.execute("SELECT 1 FROM sessions WHERE id = ?", (s,))
            if c.fetchone() is None:
                raise NotFound(f"no session {s!r}; `tether sessions` lists them")
            plan.sessions = [s]
            c.execute("SELECT seq, kind FROM rows WHERE session = ? ORDER BY seq", (s,))
            found = c.fetchall()
            if found:
                plan.rows[s] = [int(r[0]) for r in found]
                comps = [int(r[0]) for r in found if r[1] == "compaction"]
                if comps:
                    plan.checkpoints[s] = comps
            c.execute("SELECT id FROM notes WHERE session = ? ORDER BY id", (s,))
            plan.notes = [int(r[0]) for r in c.fetchall()]
            c.execute("SELECT id, status FROM runs WHERE session = ? ORDER BY ord", (s,))
            runs = c.fetchall()
            plan.runs = [r[0] for r in runs]
            plan.queued = [r[0] for r in runs if r[1] == "queued"]
            # Forks of it lose what they inherit of its own rows, and their checkpoints over
            # those rows.
            own_lo = lineage(c, s)[0].lo
            writers: set[str] = set()
            for child, low in self._descendants(c, s, own_lo):
                self._covering(c, child, low, plan.checkpoints, writers)
            for child, seqs in plan.checkpoints.items():
                if child != s:
                    plan.rows[child] = seqs
            plan.scrubbed_runs = sorted(writers)
            return plan
        if selector.kind is SelectorKind.ROW:
            return self._plan_row(c, plan, selector.value)
        return self._plan_source(c, plan, selector.value)

    def _plan_row(self, c: Cursor, plan: ErasePlan, value: str) -> ErasePlan:
        session, _, seq_text = value.rpartition("#")
        if not seq_text.isdigit():
            raise ValueError(f"a row is SESSION#SEQ, e.g. s1#4 (got {value!r})")
        check_id("session", session)
        seq = int(seq_text)
        c.execute("SELECT run FROM rows WHERE session = ? AND seq = ?", (session, seq))
        found = c.fetchone()
        if found is None:
            raise NotFound(f"no row {seq} in session {session!r}")
        writers = {found[0]} if found[0] is not None else set()
        return self._plan_rows(c, plan, {session: {seq}}, writers)

    def _plan_source(self, c: Cursor, plan: ErasePlan, source: str) -> ErasePlan:
        if not source or "\n" in source:
            raise ValueError("a source is a non-empty line of text, e.g. repo:acme/api")
        needle = json.dumps(source, ensure_ascii=False)
        # The rows that carry the source, and the runs that wrote them.
        c.execute(
            f"SELECT session, seq, run, sources FROM rows WHERE {self._source_filter()}",
            (needle,),
        )
        chosen: dict[str, set[int]] = {}
        writers: set[str] = set()
        for session, seq, run, sources in c.fetchall():
            if _holds(sources, source):
                chosen.setdefault(session, set()).add(int(seq))
                if run is not None:
                    writers.add(run)
        c.execute(
            f"SELECT id, sources FROM notes WHERE {self._source_filter()} ORDER BY id", (needle,)
        )
        plan.notes = [int(i) for i, s in c.fetchall() if _holds(s, source)]
        return self._plan_rows(c, plan, chosen, writers)

    def _plan_rows(
        self, c: Cursor, plan: ErasePlan, chosen: dict[str, set[int]], writers: set[str]
    ) -> ErasePlan:
        """``chosen`` rows (by session) and what derives from them: the rows of a run whose
        request is among them, and the compactions that cover any of them (in the session and
        in every fork that inherits it); ``writers``, the runs that wrote them, are scrubbed."""
        # A run whose request row goes: its rows answer an erased request, and go too.
        dropped_runs: set[str] = set()
        for session, seqs in chosen.items():
            for run_id in self._runs_requesting(c, session, seqs):
                dropped_runs.add(run_id)
        for run_id in sorted(dropped_runs):
            c.execute("SELECT session, seq FROM rows WHERE run = ?", (run_id,))
            for session, seq in c.fetchall():
                chosen.setdefault(session, set()).add(int(seq))
        # A compaction that covers an erased row summarizes it: it goes, in the session and
        # in every fork that inherits the row (and every compaction among the rows chosen, by
        # its sources or by its run, counts as a checkpoint).
        checkpoints: dict[str, list[int]] = {}
        for session, seqs in list(chosen.items()):
            low = min(seqs)
            self._covering(c, session, low, checkpoints, writers, also=seqs)
            for child, child_low in self._descendants(c, session, low):
                self._covering(c, child, child_low, checkpoints, writers)
        for session, comps in checkpoints.items():
            chosen.setdefault(session, set()).update(comps)
        plan.rows = {s: sorted(v) for s, v in sorted(chosen.items())}
        plan.checkpoints = {s: sorted(set(v)) for s, v in sorted(checkpoints.items())}
        plan.runs = sorted(dropped_runs)
        plan.scrubbed_runs = sorted(writers - dropped_runs)
        return plan

    def _covering(
        self,
        c: Cursor,
        session: str,
        low: int,
        into: dict[str, list[int]],
        writers: set[str],
        *,
        also: set[int] | None = None,
    ) -> None:
        """The compaction rows of ``session`` that cover seq ``low`` or later (or are among
        ``also``) join ``into``; the runs that wrote them join ``writers``."""
        c.execute(
            f"SELECT seq, body, run FROM rows {self._compactions_hint} "
            "WHERE session = ? AND kind = 'compaction' ORDER BY seq",
            (session,),
        )
        for seq, body, run in c.fetchall():
            covers = json.loads(body).get("covers_to")
            covering = isinstance(covers, int) and not isinstance(covers, bool) and covers >= low
            if covering or (also is not None and int(seq) in also):
                into.setdefault(session, []).append(int(seq))
                if run is not None:
                    writers.add(run)

    @staticmethod
    def _descendants(c: Cursor, session: str, low: int) -> list[tuple[str, int]]:
        """The forks (of forks…) of ``session`` that inherit its seq ``low``, each with the
        lowest seq of it they inherit."""
        out: list[tuple[str, int]] = []
        todo = [session]
        for _ in range(MAX_DEPTH):
            if not todo:
                break
            nxt: list[str] = []
            for parent in todo:
                c.execute(
                    "SELECT id, fork_seq FROM sessions WHERE parent = ? ORDER BY id", (parent,)
                )
                for child, fork_seq in c.fetchall():
                    if int(fork_seq) >= low:
                        out.append((child, low))
                        nxt.append(child)
            todo = nxt
        return out

    @staticmethod
    def _runs_requesting(c: Cursor, session: str, seqs: Iterable[int]) -> list[str]:
        wanted = sorted(seqs)
        out: list[str] = []
        for i in range(0, len(wanted), 500):
            part = wanted[i : i + 500]
            marks = ", ".join("?" for _ in part)
            c.execute(
                f"SELECT id FROM runs WHERE session = ? AND request_seq IN ({marks})",
                (session, *part),
            )
            out.extend(r[0] for r in c.fetchall())
        return out

    def erase(
        self, selector: Selector, *, actor: str, at: str | None = None
    ) -> tuple[Erasure, ErasePlan]:
        """Erase what ``selector`` selects, in one transaction, and keep a receipt. Refused
        (:class:`SessionBusy`, nothing written) while a run is live on an affected session: stop
        it first."""
        check_id("actor", actor)
        when = at or now_iso()
        with self._tx() as c:
            plan = self._plan(c, selector)
            for session in plan.affected_sessions:
                self._lock_session(c, session)
                c.execute(
                    "SELECT id FROM runs WHERE session = ? AND status = 'running' LIMIT 1",
                    (session,),
                )
                live = c.fetchone()
                if live is not None:
                    raise SessionBusy(session, live[0])
            self._remove(c, plan)
            counts = plan.counts()
            c.execute(
                "INSERT INTO erasures (at, actor, selector, counts) VALUES (?, ?, ?, ?) "
                "RETURNING id",
                (when, actor, canonical_json(selector.to_json()), canonical_json(counts)),
            )
            receipt_id = int(c.fetchone()[0])
        self._after_erase()
        return Erasure(receipt_id, when, actor, selector.to_json(), counts), plan

    def _remove(self, c: Cursor, plan: ErasePlan) -> None:
        for session, seqs in plan.rows.items():
            for i in range(0, len(seqs), 500):
                part = seqs[i : i + 500]
                marks = ", ".join("?" for _ in part)
                c.execute(
                    f"DELETE FROM rows WHERE session = ? AND seq IN ({marks})", (session, *part)
                )
        for i in range(0, len(plan.notes), 500):
            part = plan.notes[i : i + 500]
            marks = ", ".join("?" for _ in part)
            c.execute(f"DELETE FROM notes WHERE id IN ({marks})", part)
        for run_id in plan.scrubbed_runs:
            c.execute("SELECT extra FROM runs WHERE id = ?", (run_id,))
            found = c.fetchone()
            if found is None:
                continue
            extra = codec.loads_extra(found[0])
            kept = {k: v for k, v in extra.items() if k not in SCRUBBED_RUN_KEYS}
            kept["erased"] = True
            c.execute("UPDATE runs SET extra = ? WHERE id = ?", (canonical_json(kept), run_id))
        for run_id in plan.runs:
            c.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        for session in plan.sessions:
            self._unfork_children(c, session)
            c.execute("DELETE FROM sessions WHERE id = ?", (session,))

    @staticmethod
    def _unfork_children(c: Cursor, session: str) -> None:
        """Before a session goes, its forks inherit from its parent instead (within both
        bounds), or from nothing: its own rows are a gap in their views."""
        c.execute(
            "SELECT parent, fork_seq, fork_ord, fork_note FROM sessions WHERE id = ?", (session,)
        )
        up = c.fetchone()
        c.execute(
            "SELECT id, fork_seq, fork_ord, fork_note FROM sessions WHERE parent = ?", (session,)
        )
        for child, fseq, ford, fnote in c.fetchall():
            if up is None or up[0] is None:
                c.execute("UPDATE sessions SET parent = NULL WHERE id = ?", (child,))
                continue
            c.execute(
                "UPDATE sessions SET parent = ?, fork_seq = ?, fork_ord = ?, fork_note = ? "
                "WHERE id = ?",
                (
                    up[0],
                    min(int(fseq), int(up[1])),
                    min(int(ford), int(up[2])),
                    min(int(fnote), int(up[3])),
                    child,
                ),
            )

    def _after_erase(self) -> None:
        """The engine's part after an erasure commits (SQLite: merge the text index, truncate
        the WAL)."""

    def erasures(self, *, limit: int = 100) -> list[Erasure]:
        """The newest erasure receipts first."""
        with self._read() as c:
            c.execute(
                "SELECT id, at, actor, selector, counts FROM erasures ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            return [
                Erasure(int(r[0]), r[1], r[2], json.loads(r[3]), json.loads(r[4]))
                for r in c.fetchall()
            ]

    def idle_sessions(self, before: str, *, limit: int = 1000) -> list[str]:
        """Sessions whose newest activity (created, a run started or ended, a note) is before
        ``before`` (an interchange timestamp), and with no queued or running run."""
        with self._read() as c:
            c.execute(
                "SELECT s.id FROM sessions s WHERE s.created < ? "
                "AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.session = s.id AND ("
                "r.status IN ('queued', 'running') OR r.started >= ? OR r.ended >= ?)) "
                "AND NOT EXISTS (SELECT 1 FROM notes n WHERE n.session = s.id AND n.at >= ?) "
                "ORDER BY s.id LIMIT ?",
                (before, before, before, before, limit),
            )
            return [r[0] for r in c.fetchall()]


class Erased(msgspec.Struct, frozen=True):
    """An erasure done (or, with ``dry_run``, what it would do): the plan, the receipt (None
    on a dry run) and the run directories removed (or to remove)."""

    plan: ErasePlan
    receipt: Erasure | None
    run_dirs: list[str]
    stopped: tuple[dict[str, Any], ...] = ()
    """The live runs the erasure stopped first (on a dry run: the ones it would stop)."""
    workspaces: tuple[str, ...] = ()
    """The sessions whose workspaces were removed (or would be): :mod:`tether.pi.workspace`."""

    def to_json(self) -> dict[str, Any]:
        out = self.plan.to_json()
        out["dry_run"] = self.receipt is None
        out["run_dirs"] = self.run_dirs
        out["stopped"] = list(self.stopped)
        out["workspaces"] = list(self.workspaces)
        out["counts"] = {
            **out["counts"],
            "run_dirs": len(self.run_dirs),
            "workspaces": len(self.workspaces),
        }
        if self.receipt is not None:
            out["receipt"] = self.receipt.to_json()
        return out


def _run_files(runs_dir: Path, run_id: str) -> list[Path]:
    # A run's directory (pi's session file, its events, its log), the same set aside to be
    # removed (RUNS_DIR/.discarded/RUN: a run that ended well, whose rm -rf may still be going
    # or was cut short) and an end kept on disk for the next reconcile
    # (RUNS_DIR/unrecorded/RUN.json), which holds its answer.
    check_id("run", run_id)
    places = (
        runs_dir / run_id,
        runs_dir / DISCARDED_DIR / run_id,
        runs_dir / "unrecorded" / f"{run_id}.json",
    )
    return [p for p in places if p.exists()]


def erase_selected(
    ledger: Lifecycle,
    selector: Selector,
    *,
    actor: str,
    runs_dir: Path,
    dry_run: bool = False,
) -> Erased:
    """Erase ``selector`` in the ledger and the run directories of the runs it touches (or,
    with ``dry_run``, say exactly that without doing it)."""
    if dry_run:
        plan = ledger.plan_erasure(selector)
        return Erased(plan, None, [r for r in plan.run_dirs if _run_files(runs_dir, r)])
    receipt, plan = ledger.erase(selector, actor=actor)
    dirs: list[str] = []
    for run_id in plan.run_dirs:
        found = _run_files(runs_dir, run_id)
        for path in found:
            if path.is_dir():
                # ignore_errors: a set-aside directory's own rm -rf may remove files under us;
                # whatever is left is checked below.
                shutil.rmtree(path, ignore_errors=True)
                if path.exists():
                    shutil.rmtree(path)  # left over: raise what stops its removal
            else:
                path.unlink()
        if found:
            dirs.append(run_id)
    return Erased(plan, receipt, dirs)


def apply_retention(
    ledger: Lifecycle,
    idle_days: int,
    *,
    actor: str,
    runs_dir: Path,
    now: datetime.datetime | None = None,
    dry_run: bool = False,
) -> list[Erased]:
    """Erase every session idle for ``idle_days`` (docs/operations.md#erasure-and-retention), one
    receipt each."""
    moment = now or datetime.datetime.now(datetime.UTC)
    cutoff = (moment - datetime.timedelta(days=idle_days)).isoformat().replace("+00:00", "Z")
    done: list[Erased] = []
    for session in ledger.idle_sessions(cutoff):
        try:
            done.append(
                erase_selected(
                    ledger,
                    Selector(SelectorKind.SESSION, session),
                    actor=actor,
                    runs_dir=runs_dir,
                    dry_run=dry_run,
                )
            )
        except (SessionBusy, NotFound):
            continue  # it became busy (or went) since it was listed: not idle any more
    return done
