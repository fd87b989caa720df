"""The mirror: pi's session file, entry by entry, into the ledger through fenced step writes.

pi appends each entry to the run's session file synchronously, before it reports the event, so
the mirror reads complete lines from where it stopped whenever the run pokes it (on message,
compaction and settle events), and every ``poll_s`` in case a poke is missed. Each batch is one
fenced ``append``; rows carry pi's entry id, so reading the file again (a restart) never
duplicates a row.

Entries it does not write:

- the ones tether wrote into the file itself before pi started (the follow-up view),
- the user message carrying the run's request, already written as the run's request row,
- a failed attempt (an assistant message that stopped with ``error`` or ``length``) that pi
  omits from context with a ``context_edit`` and then retries: pi's raw history keeps it, the
  ledger keeps what the model goes on to see (the count is in ``omitted_attempts``). An attempt
  no retry follows is written: it is the run's last word,
- pi's bookkeeping and edit entries (see :mod:`tether.pi.sessionformat`).

Rows only from pi (docs/security.md). What pi's tools can write is not trusted, and with
``sandbox = "none"`` they can write pi's session file:

- the file is opened without following a link (``tether.files.open_own``): the one tether made
  (``file_id``), or tether's own link to it by its known target; any other file is never read;
- given the run's announcements (:class:`~tether.mirror.announced.Announced`, fed with pi's RPC
  records), an entry that becomes a row, or edits one, is mirrored only once pi announced it.
  pi announces its entries in the order it writes them, so an entry not announced while a later
  one is (or when pi has exited) was not written by pi: it becomes no row and is named in
  ``problems``. A user message is mirrored only as the run's request or a text tether relayed;
- given the run's nonce, a compaction is tether's continuation checkpoint only if its marker
  carries the extension's proof for this run (:func:`tether.pi.continuation.proven`), which the
  row does not keep; a marker without it is dropped, and the compaction is pi's own.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec

from tether.access import Obligations
from tether.errors import LedgerError
from tether.events import EventBus, RowsMirrored
from tether.files import FileId, ForeignFile, open_own
from tether.ledger import Fence, NewRow, Row, RowKind
from tether.ledger.roles import RowWriter
from tether.mirror.announced import Announced, vouched
from tether.mirror.entries import ROW_KINDS, Actors, entry_row
from tether.pi.continuation import MAC_FIELD, proven
from tether.pi.sessionfile import SESSION_LINK
from tether.pi.sessionformat import EntryKind, entry_kind, entry_message, entry_time, message_text
from tether.sandbox.limits import LimitHit, LimitWatch
from tether.threads import in_thread

__all__ = ["Mirror", "SessionTail"]

HELD_STOPS = frozenset({"error", "length"})


class SessionTail:
    """Complete JSONL lines appended to a file since the last read. The file is opened without
    following a link (``tether.files.open_own``): given ``expect``, only the file tether made;
    ``RUN_DIR/session.jsonl`` may be tether's own link to ``pi-session/session.jsonl``, taken by
    that target. Anything else is never read, and named in ``problems``."""

    def __init__(self, path: Path, offset: int = 0, *, expect: FileId | None = None) -> None:
        self.path = path
        self.offset = offset
        self.expect = expect
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def grown(self) -> bool:
        """Whether the file may hold lines not read yet: it is longer or shorter (rewritten)
        than what was read, or not the file it was (a read says what it is). An ``lstat`` or
        two: most pokes come after an entry already mirrored."""
        try:
            found = os.stat(self.path, follow_symlinks=False)
            if stat.S_ISLNK(found.st_mode):
                if os.readlink(self.path) != SESSION_LINK:
                    return True
                found = os.stat(self.path.parent / SESSION_LINK, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        if not stat.S_ISREG(found.st_mode):
            return True
        if self.expect is not None and (found.st_dev, found.st_ino) != tuple(self.expect):
            return True
        return found.st_size != self.offset

    def read(self) -> list[dict[str, Any]]:
        try:
            with open_own(self.path, expect=self.expect, link=SESSION_LINK) as f:
                f.seek(0, 2)
                size = f.tell()
                if size < self.offset:  # rewritten (pi migrates old files): read it all again
                    self.offset = 0
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        except ForeignFile as exc:
            self.problem(f"pi's session file was not read: {exc}")
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out: list[dict[str, Any]] = []
        for line in data[:end].split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = _decode(line)
            except ValueError as exc:
                self.problems.append(f"unreadable session line at byte {self.offset}: {exc}")
                continue
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                out.append(entry)
        return out


def _decode(line: bytes) -> Any:
    """One session line: msgspec first (several times faster); what it refuses goes to json,
    so a line reads, or fails, exactly as with json alone (as :func:`tether.pi.jsonl.decode`)."""
    try:
        return msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return json.loads(line)


class _Pending(msgspec.Struct):
    rows: list[NewRow]
    times: list[float | None]


class Mirror:
    def __init__(
        self,
        ledger: RowWriter,
        fence: Fence,
        *,
        session_file: Path,
        actors: Actors,
        start_offset: int = 0,
        known: dict[str, int | None] | None = None,
        request: tuple[str, int] | None = None,
        bus: EventBus | None = None,
        poll_s: float = 0.25,
        obligations: Obligations | None = None,
        limits: LimitWatch | None = None,
        announced: Announced | None = None,
        nonce: str | None = None,
        file_id: FileId | None = None,
    ) -> None:
        self._ledger = ledger
        self._fence = fence
        self._actors = actors
        self._tail = SessionTail(session_file, start_offset, expect=file_id)
        self._announced = announced
        """What pi announced over RPC (None: a file read without pi's records, every entry
        taken as pi's, as an import takes a file)."""
        self._nonce = nonce
        """The run's continuation nonce (None: a marker is taken as it is)."""
        self._unheard: list[dict[str, Any]] = []
        """Entries read but not announced yet, in the file's order (with what follows them)."""
        self.last_answer: str | None = None
        """The text of the last assistant message that is (or, a write failing, was to be) a
        row: the answer pi authored, as the ledger has it."""
        self._known: dict[str, int | None] = dict(known or {})
        self._order: list[str] = list(self._known)
        self._request = request
        self._bus = bus or EventBus()
        self._obligations = obligations or Obligations()
        """What the run was given: every row it writes carries these sources too."""
        self._poll = poll_s
        self._limits = limits
        """Reads the tool results it writes for the sandbox limits they hit (a sandboxed run)."""
        self._held: dict[str, Any] | None = None
        """A failed attempt (``error``/``length``), until pi says whether it omits it."""
        self._omitted: list[dict[str, Any]] = []
        """An attempt pi omitted from context, then the entries after it, until a retry answers."""
        self._lock = anyio.Lock()
        self._wake = anyio.Event()
        self.omitted_attempts = 0
        self.skipped: Counter[str] = Counter()
        self.rows_written = 0

    @property
    def problems(self) -> list[str]:
        return self._tail.problems

    def heard(self, record: Any) -> None:
        """A record pi wrote (the harness's follower passes each one, in order)."""
        if self._announced is not None and isinstance(record, dict):
            self._announced.hear(record)

    @property
    def limits_hit(self) -> list[LimitHit]:
        """The sandbox limits the run's tools hit, in the rows written so far."""
        return list(self._limits.hits) if self._limits is not None else []

    def seq_of(self, entry_id: str) -> int | None:
        return self._known.get(entry_id)

    def poke(self) -> None:
        """Something was appended: sync soon."""
        self._wake.set()

    async def run(self) -> None:
        """Sync on every poke (and every ``poll_s``) until cancelled."""
        while True:
            with anyio.move_on_after(self._poll if self._poll > 0 else math.inf):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.sync()

    async def sync(self, *, final: bool = False) -> list[Row]:
        """Mirror everything pi has appended so far. ``final`` (pi has exited) also writes an
        attempt still held or omitted without a retry: it was the run's last word."""
        if not final and not self._lock.locked() and not self._unheard and not self._tail.grown():
            # Nothing appended since the last pass (most pokes follow an entry already
            # mirrored), and no pass under way whose rows a caller must wait for: a pass would
            # read nothing, and a held attempt waits for what follows it.
            return []
        async with self._lock:
            # Shielded: a sync is short and must not stop halfway, or the entries it has read
            # but not yet written would be lost to the next one.
            written: list[Row] = []
            with anyio.CancelScope(shield=True):
                written = await self._sync(final)
            return written

    async def _sync(self, final: bool) -> list[Row]:
        # A write that fails (a full disk, a lost ledger) leaves the mirror as it was before
        # this pass: the next pass reads the same entries again, and the rows already written
        # by this one are skipped by their entry ids.
        saved = (
            self._tail.offset,
            len(self._order),
            len(self._known),
            self._held,
            list(self._omitted),
            self._request,
            self.omitted_attempts,
            list(self._unheard),
        )
        if self._announced is not None:
            self._announced.begin()
        try:
            return await self._pass(final)
        except LedgerError:
            offset, order, known, self._held, self._omitted, self._request = saved[:6]
            self.omitted_attempts, self._unheard = saved[6], saved[7]
            if self._announced is not None:
                self._announced.give_back()
            self._tail.offset = offset
            del self._order[order:]
            # The entries this pass came to know (dicts keep insertion order) are read again.
            for eid in list(self._known)[known:]:
                del self._known[eid]
            raise

    async def _pass(self, final: bool) -> list[Row]:
        batch = _Pending([], [])
        written: list[Row] = []
        entries = [*self._unheard, *self._tail.read()]
        self._unheard = []
        # pi announces its entries in the order it writes them: an entry not announced before a
        # later one that is (or once pi has exited) is not pi's.
        last_heard = -1
        if self._announced is not None:
            for at in range(len(entries) - 1, -1, -1):
                if vouched(entries[at]) and self._announced.has(entries[at]):
                    last_heard = at
                    break
        for at, entry in enumerate(entries):
            eid = entry["id"]
            if eid in self._known:
                continue
            if self._announced is not None and vouched(entry):
                if not self._announced.take(entry):
                    if not final and at > last_heard:
                        self._unheard = entries[at:]  # its announcement may be on its way
                        break
                    self._not_pis(entry, "pi did not announce it over RPC")
                    continue
                why = self._unsent(entry)
                if why is not None:
                    self._not_pis(entry, why)
                    continue
            self._order.append(eid)
            written += await self._take(entry, batch)
        while final and (self._omitted or self._held is not None):
            if self._omitted:
                attempt, *after = self._omitted
                self._omitted = []
                self._add(batch, attempt)
                for entry in after:
                    written += await self._take(entry, batch)
            elif self._held is not None:
                self._add(batch, self._held)
                self._held = None
        written += await self._flush(batch)
        return written

    async def _take(self, entry: dict[str, Any], batch: _Pending) -> list[Row]:
        """Route one new entry: into the batch, held back, or set aside."""
        eid = entry["id"]
        message = entry_message(entry) or {}
        is_assistant = message.get("role") == "assistant"
        if self._omitted:
            # An omitted attempt waits for pi's retry to answer; what follows waits with it,
            # so rows keep pi's order.
            self._omitted.append(entry)
            if not is_assistant:
                return []
            attempt, *after = self._omitted
            self._omitted = []
            self._known[attempt["id"]] = None
            self.omitted_attempts += 1
            written: list[Row] = []
            for later in after:
                written += await self._take(later, batch)
            return written
        if self._held is not None:
            held = self._held
            self._held = None
            if (
                entry.get("type") == "context_edit"
                and entry.get("targetId") == held["id"]
                and entry.get("replacement") is None
            ):
                self._known[eid] = None
                self._omitted = [held]
                return []
            self._add(batch, held)
        kind = entry_kind(entry)
        if kind is EntryKind.COMPACTION:
            return await self._flush(batch) + await self._compaction(entry)
        if kind not in ROW_KINDS:
            self._known[eid] = None
            self.skipped[str(entry.get("type"))] += 1
        elif self._is_request(message):
            assert self._request is not None
            self._known[eid] = self._request[1]
            self._request = None
        elif is_assistant and message.get("stopReason") in HELD_STOPS:
            self._held = entry
        else:
            self._add(batch, entry)
        return []

    async def append_receipt(self, body: dict[str, Any]) -> Row:
        """Store a receipt (e.g. ``continuation_checkpoint_refused``) in order with the rows."""
        async with self._lock:
            row = NewRow(actor=self._actors.agent_actor, kind=RowKind.RECEIPT, body=body)
            rows = await self._write([row], [time.time()])
            return rows[0]

    # -- internals -------------------------------------------------------------------------------

    def _not_pis(self, entry: dict[str, Any], why: str) -> None:
        """An entry pi did not write (or tether did not send): no row, named in ``problems``."""
        eid = entry["id"]
        self._known[eid] = None
        self.skipped["not_pis"] += 1
        kind = entry.get("type")
        role = (entry_message(entry) or {}).get("role")
        what = f"{kind} entry {eid!r}" + (f" ({role})" if role else "")
        self._tail.problem(f"pi's session file holds a {what} that was not mirrored: {why}")

    def _unsent(self, entry: dict[str, Any]) -> str | None:
        """Why a user message pi announced is no request of this run (None: it is one)."""
        message = entry_message(entry)
        if message is None or message.get("role") != "user":
            return None
        text = message_text(message)
        if self._is_request(message) or text in self._actors.relayed:
            return None
        if self._announced is not None and self._announced.queued(text):
            return None
        return "its text is neither the run's request nor one tether relayed into the run"

    def _is_request(self, message: dict[str, Any]) -> bool:
        return (
            self._request is not None
            and message.get("role") == "user"
            and message_text(message) == self._request[0]
        )

    def _add(self, pending: _Pending, entry: dict[str, Any]) -> None:
        row = entry_row(entry, self._actors)
        if row is None:
            self._known[entry["id"]] = None
            return
        if row.body.get("role") == "assistant":
            text = message_text(row.body)
            self.last_answer = text if text.strip() else self.last_answer
        pending.rows.append(row)
        pending.times.append(entry_time(entry))

    async def _flush(self, pending: _Pending) -> list[Row]:
        if not pending.rows:
            return []
        rows = await self._write(pending.rows, pending.times)
        pending.rows.clear()
        pending.times.clear()
        return rows

    async def _write(self, rows: list[NewRow], times: list[float | None]) -> list[Row]:
        rows = [
            msgspec.structs.replace(row, sources=self._obligations.stamp(row.sources))
            for row in rows
        ]
        stored = await in_thread(self._ledger.append, self._fence, rows)
        now = time.time()
        for row in stored:
            if row.entry_id is not None:
                self._known[row.entry_id] = row.seq
            if self._limits is not None and row.kind is RowKind.MESSAGE:
                self._limits.see(row.seq, row.body)
        self.rows_written += len(stored)
        self._bus.emit(
            RowsMirrored(
                seqs=tuple(r.seq for r in stored),
                entry_ids=tuple(r.entry_id or "" for r in stored),
                written_at=now,
                entry_times=tuple(t if t is not None else now for t in times),
            )
        )
        return stored

    def _covers_to(self, entry: dict[str, Any], last_seq: int) -> int:
        first_kept = entry.get("firstKeptEntryId")
        if not isinstance(first_kept, str) or first_kept == entry["id"]:
            return last_seq  # self-retaining: it covers every row before it
        if first_kept not in self._order:
            return 0  # a kept entry the mirror never saw: claim to cover nothing
        for eid in self._order[self._order.index(first_kept) :]:
            seq = self._known.get(eid)
            if seq is not None:
                return seq - 1
        return last_seq

    def _checked_marker(self, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with its continuation marker as the row keeps it: without the extension's
        proof (checked against the run's nonce, then dropped), or without the marker at all
        when the proof is not this run's: the compaction is then pi's own, not tether's
        checkpoint."""
        details = entry.get("details")
        marker = details.get("continuation") if isinstance(details, dict) else None
        if self._nonce is None or marker is None:
            return entry
        assert isinstance(details, dict)
        summary = entry.get("summary")
        if proven(marker, nonce=self._nonce, run=self._fence.run, summary=summary):
            kept = {k: v for k, v in marker.items() if k != MAC_FIELD}
            return {**entry, "details": {**details, "continuation": kept}}
        self._tail.problem(
            f"pi's session file holds a compaction entry {entry['id']!r} whose continuation "
            "marker does not carry this run's proof: stored as pi's own compaction, not as "
            "tether's checkpoint"
        )
        return {**entry, "details": {k: v for k, v in details.items() if k != "continuation"}}

    async def _compaction(self, entry: dict[str, Any]) -> list[Row]:
        entry = self._checked_marker(entry)
        last = await in_thread(self._ledger.last_seq, self._fence.session)
        row = entry_row(
            entry, self._actors, covers_to=self._covers_to(entry, last), seq_of=self.seq_of
        )
        assert row is not None  # a compaction entry always makes a row
        return await self._write([row], [entry_time(entry)])
