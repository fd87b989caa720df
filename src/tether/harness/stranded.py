"""A run's end that the ledger could not take, kept until it can (issue 12: no run is left
``running`` by a storage error).

When even ``end_run`` fails for longer than ``harness.storage_retry_s`` (the disk stays full,
the server stays away), the harness writes the end it meant to record into
``RUNS_DIR/unrecorded/RUN.json``; the next run on that ledger records it, under the run's own
fence (a newer owner's claim wins, and the file is dropped).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from tether.errors import FencedOut, NotFound, RunNotActive, StorageError
from tether.files import private_dir, private_file
from tether.ledger import Fence, Ledger, NewRow, RowKind, RunStatus
from tether.pi.continuation import RECEIPT_KIND

__all__ = ["UNRECORDED_DIR", "keep_stranded_end", "record_stranded_ends"]

UNRECORDED_DIR = "unrecorded"


def _dir(runs_dir: Path) -> Path:
    return runs_dir / UNRECORDED_DIR


def keep_stranded_end(
    runs_dir: Path,
    fence: Fence,
    status: RunStatus,
    extra: dict[str, Any],
    refusing: str | None,
) -> str:
    """Keep the end; returns where it is (or why it could not be kept, as words)."""
    path = _dir(runs_dir) / f"{fence.run}.json"
    record = {
        "run": fence.run,
        "session": fence.session,
        "epoch": fence.epoch,
        "status": status.value,
        "extra": extra,
        "refusing": refusing,
    }
    try:
        private_dir(path.parent)  # it holds the run's answer: private whatever the umask
        tmp = path.with_suffix(".tmp")
        private_file(tmp).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        return f"nowhere ({path} could not be written: {exc.strerror}; the run stays running)"
    return str(path)


def record_stranded_ends(ledger: Ledger, runs_dir: Path) -> int:
    """Record the ends kept by earlier runs; returns how many were recorded. Ends that the
    ledger still cannot take stay where they are."""
    folder = _dir(runs_dir)
    if not folder.is_dir():
        return 0
    recorded = 0
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            fence = Fence(run=record["run"], session=record["session"], epoch=int(record["epoch"]))
            status = RunStatus(record["status"])
            extra = dict(record["extra"])
            refusing = record.get("refusing")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge: left for an operator
        try:
            # Ended already (perhaps by a pass whose refusal then failed): refuse still.
            with contextlib.suppress(RunNotActive):
                _owed_refusal(ledger, fence, extra)
                ledger.end_run(fence, status, extra=extra)
            if refusing:
                ledger.set_refusing(fence.session, refusing)
        except (FencedOut, NotFound):
            pass  # another owner holds it, or it is gone: nothing left to record
        except StorageError:
            return recorded  # still cannot write: the next reconcile tries again
        with contextlib.suppress(OSError):
            path.unlink()
        recorded += 1
    return recorded


def _owed_refusal(ledger: Ledger, fence: Fence, extra: dict[str, Any]) -> None:
    """A refused checkpoint whose refusal the ledger could not take (its disk filled while the
    summary was made): the receipt row, which the next view's notice names, and the mark that
    the run's context may require recall, as the straight path stores them; added to ``extra``.
    Nothing when the refusal was stored before the end was stranded."""
    label = extra.get("checkpoint")
    if not isinstance(label, str) or not label.startswith("refused:"):
        return
    run = ledger.get_run(fence.run)
    if run.extra.get("needs_recall") is not True:
        last = ledger.last_seq(fence.session)
        mine = ledger.run_rows_before(fence.run, last + 1, limit=50)
        if not any(r.kind is RowKind.RECEIPT for r in mine):
            body = {"kind": RECEIPT_KIND, "run": fence.run, "reason": label.split(":", 1)[1]}
            ledger.append(fence, [NewRow(f"agent:{run.agent}", RowKind.RECEIPT, body)])
            extra.setdefault(
                "checkpoint_detail",
                "the refusal was recorded late: the ledger could not take it when the run ended",
            )
    extra["needs_recall"] = True
