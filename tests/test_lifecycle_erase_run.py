"""Erasure end to end (docs/operations.md#erasure-and-retention), with the real pi and the scripted
provider, on SQLite and
PostgreSQL: a unique text planted in a row with source ``repo:x`` is quoted by a real run into
its answer and its continuation checkpoint, and a note takes it too; after ``tether erase
--source repo:x`` no command, API route, page, export or recall returns it, the ledger's bytes
hold it nowhere, rows of other sources are untouched, and the receipt is there. ``--dry-run``
listed exactly what went."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from checkpoint_support import AGENT, config, long_task, rows_of, run
from followup_sessions import USAGE, assistant, user
from pg import postgres_url
from provider import Reply, route
from support.fs import files_under
from tether.config import AccessConfig, Config, RetentionConfig, ServiceConfig
from tether.files import DISCARDED_DIR
from tether.followup import FollowupView, build_view
from tether.interop.pi_export import export_pi
from tether.ledger import Ledger, NewRow, Row, RowKind, RunStatus, open_ledger
from tether.recall import read_range, search
from tether.service.app import create_app

pytestmark = pytest.mark.slow

PLANT = "ZQPLANT93F1C7"
"""The planted text: one word, so the full-text index holds it as a token too (lowercased)."""
NEEDLES = (PLANT.encode(), PLANT.lower().encode())
OTHER = "KEEPME44B2 stays"
TOKEN = "ana-token"
TETHER = Path(sys.executable).with_name("tether")


def _msg(role: str, text: str) -> dict[str, Any]:
    # no tokens counted: these rows are written by the test, not by a provider
    if role == "assistant":
        return assistant(text, usage={**USAGE, "input": 0, "output": 0, "totalTokens": 0})
    return user(text)


def _seed(ledger: Ledger) -> None:
    """s1: a turn of source repo:y (kept), then a turn whose request carries repo:x and the
    planted text. s2: a turn of source repo:y alone."""
    for session in ("s1", "s2"):
        ledger.ensure_session(session)
        fence = ledger.claim_run(ledger.create_run(session, AGENT).id)
        ledger.append(
            fence,
            [
                NewRow.message(
                    "user:ana", _msg("user", f"{OTHER} in {session}"), sources=("repo:y",)
                )
            ],
            request=True,
        )
        ledger.append(
            fence, [NewRow.message(f"agent:{AGENT}", _msg("assistant", "ok"), sources=("repo:y",))]
        )
        ledger.end_run(fence, RunStatus.FINISHED)
    fence = ledger.claim_run(ledger.create_run("s1", AGENT).id)
    ledger.append(
        fence,
        [
            NewRow.message(
                "user:ana", _msg("user", f"The vault code is {PLANT}."), sources=("repo:x",)
            )
        ],
        request=True,
    )
    ledger.append(fence, [NewRow.message(f"agent:{AGENT}", _msg("assistant", "noted"))])
    ledger.end_run(fence, RunStatus.FINISHED)


def _cfg(tmp: Path, provider: Any, url: str) -> tuple[Config, Path]:
    base = config(tmp, provider, ledger_url=url)
    cfg = base.model_copy(
        update={
            "access": AccessConfig(grants={"user:ana": ["repo:*"]}),
            "service": ServiceConfig(
                tokens={hashlib.sha256(TOKEN.encode()).hexdigest(): "user:ana"},
                admins=["user:ana"],
            ),
            "retention": RetentionConfig(),
        }
    )
    path = tmp / "tether.toml"
    path.write_text(f'[ledger]\nurl = "{url}"\n[harness]\nruns_dir = "{tmp / "runs"}"\n')
    return cfg, path


def _cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TETHER), *args, "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TETHER_CONFIG": str(path)},
        check=False,
    )


def _view(ledger: Ledger, cfg: Config) -> FollowupView:
    view = build_view(
        ledger,
        session="s1",
        agent=AGENT,
        actor="user:ana",
        request="And now?",
        config=cfg.followup,
        grants=cfg.access.grants,
    )
    assert isinstance(view, FollowupView), view
    return view


def _everything(ledger: Ledger, cfg: Config, path: Path, run_id: str) -> dict[str, str]:
    """What every reader returns for s1, as text: the view, recall, the export, the API
    routes, the pages, the CLI's dump and log."""
    got: dict[str, str] = {}
    got["view"] = json.dumps(_view(ledger, cfg).to_json(), ensure_ascii=False)
    # Recall's answers (the query itself, which an answer repeats, left out).
    found = search(ledger, "s1", PLANT, actor="user:ana", grants=cfg.access.grants)
    got["recall"] = json.dumps([h.to_json() for h in found.hits], ensure_ascii=False)
    read = read_range(ledger, "s1", 1, 10_000, actor="user:ana", grants=cfg.access.grants)
    got["recall range"] = json.dumps(read.to_json(), ensure_ascii=False)
    out = io.StringIO()
    export_pi(ledger, "s1", out, cwd="/")
    got["export"] = out.getvalue()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(cfg, ledger)) as c:
        for url in (
            "/v1/sessions/s1/rows?limit=1000",
            f"/v1/sessions/s1/context?agent={AGENT}",
            f"/v1/runs/{run_id}",
            "/sessions/s1",
            f"/sessions/s1/next?agent={AGENT}",
            "/v1/erasures",
        ):
            r = c.get(url, headers=headers)
            assert r.status_code == 200, (url, r.text)
            got[url] = r.text
    for args in (("ledger", "dump", "--session", "s1"), ("log", "--session", "s1")):
        done = _cli(path, *args)
        assert done.returncode == 0, done.stderr
        got[" ".join(args)] = done.stdout
    return got


def _holders(texts: dict[str, str]) -> list[str]:
    return sorted(k for k, v in texts.items() if PLANT in v or PLANT.lower() in v)


def _files_holding(root: Path) -> list[str]:
    found = []
    for p in files_under(root):
        if not p.is_symlink():
            try:
                data = p.read_bytes()
            except FileNotFoundError:  # removed since the walk: a run directory's rm -rf
                continue
            if any(n in data for n in NEEDLES):
                found.append(str(p.relative_to(root)))
    return found


def _postgres_tables_holding(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        ]
        found = []
        for t in tables:
            for (text,) in conn.execute(f'SELECT t::text FROM "{t}" t'):
                if PLANT in text or PLANT.lower() in text:
                    found.append(t)
                    break
    return found


def _rows(ledger: Ledger, session: str) -> list[Row]:
    return list(ledger.iter_rows(session))


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_erasing_a_source_leaves_its_text_nowhere(
    engine: str, scripted_provider: Any, tmp_path: Path
) -> None:
    url = f"sqlite://{tmp_path}/ledger.db" if engine == "sqlite" else postgres_url(tmp_path)
    summary = f"## Goal\nKeep the vault code {PLANT} in mind.\n\n## Progress\n- [x] counted"
    provider = scripted_provider(
        route(task=long_task(f"The vault code is {PLANT}."), summary=[Reply(summary)])
    )
    ledger = open_ledger(url)
    try:
        _seed(ledger)
        cfg, path = _cfg(tmp_path, provider, url)
        outcome = run(ledger, cfg, tmp_path)
        assert (outcome.status, outcome.checkpoint.label) == (RunStatus.FINISHED, "written")
        [checkpoint] = rows_of(ledger, "s1", RowKind.COMPACTION)
        assert PLANT in checkpoint.body["summary"]
        assert "repo:x" in checkpoint.sources
        ledger.add_note("s1", AGENT, f"vault code: {PLANT}", actor="user:ana", sources=["repo:x"])
        ledger.add_note("s1", AGENT, "a note of repo:y", actor="user:ana", sources=["repo:y"])
        kept = {"s2": _rows(ledger, "s2"), "s1": _rows(ledger, "s1")[:2]}
        assert all(r.sources == ("repo:y",) for rs in kept.values() for r in rs)
        before = {s: {r.seq for r in _rows(ledger, s)} for s in ("s1", "s2")}

        # Before: the text is everywhere (so the checks below can fail).
        seen = _everything(ledger, cfg, path, outcome.run)
        assert {
            "view",
            "recall",
            "recall range",
            "export",
            "ledger dump --session s1",
            "/v1/sessions/s1/rows?limit=1000",
            f"/v1/runs/{outcome.run}",
            "/sessions/s1",
        } <= set(_holders(seen))
        # A run directory ends removed when its run ends well; one kept (a run that failed, an
        # end kept for the next reconcile) holds pi's session file: made here as it would be.
        kept_dir = tmp_path / "runs" / outcome.run
        kept_dir.mkdir(parents=True, exist_ok=True)
        (kept_dir / "session.jsonl").write_text(seen["export"])
        (tmp_path / "runs" / "unrecorded").mkdir(exist_ok=True)
        (tmp_path / "runs" / "unrecorded" / f"{outcome.run}.json").write_text(seen["view"])
        # A directory set aside for removal whose rm -rf was cut short (a crash) holds it too.
        aside = tmp_path / "runs" / DISCARDED_DIR / outcome.run / "sub"
        aside.mkdir(parents=True, exist_ok=True)
        (aside / "session.jsonl").write_text(seen["export"])
        assert _files_holding(tmp_path / "runs")

        dry = _cli(path, "erase", "--source", "repo:x", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        planned = json.loads(dry.stdout)
        assert planned["dry_run"] is True
        # The dry run erased nothing.
        assert {s: {r.seq for r in _rows(ledger, s)} for s in ("s1", "s2")} == before
        assert ledger.erasures() == []

        done = _cli(path, "erase", "--source", "repo:x", "--json", "--actor", "user:op")
        assert done.returncode == 0, done.stderr
        erased = json.loads(done.stdout)
        after = {s: {r.seq for r in _rows(ledger, s)} for s in ("s1", "s2")}

        # --dry-run listed exactly what went.
        gone = {s: sorted(before[s] - after[s]) for s in before if before[s] - after[s]}
        assert planned["rows"] == gone == erased["rows"]
        assert checkpoint.seq in gone["s1"]
        assert planned["run_dirs"] == erased["run_dirs"] == [outcome.run]
        assert {k: v for k, v in planned.items() if k not in ("dry_run", "receipt")} == {
            k: v for k, v in erased.items() if k not in ("dry_run", "receipt")
        }
        assert planned["counts"]["notes"] == 1
        assert [n.text for n in ledger.all_notes("s1")] == ["a note of repo:y"]
        # Rows of other sources are untouched.
        assert _rows(ledger, "s2") == kept["s2"]
        assert _rows(ledger, "s1")[:2] == kept["s1"]
        # The receipt: when, by whom, the selector, the counts; no content.
        [receipt] = ledger.erasures()
        assert (receipt.actor, receipt.selector) == ("user:op", {"source": "repo:x"})
        assert receipt.counts["rows"] == sum(len(v) for v in gone.values())
        assert receipt.counts["checkpoints"] == 1
        assert PLANT not in json.dumps(receipt.to_json())

        # No reader returns the text; the next view has no checkpoint.
        assert _holders(_everything(ledger, cfg, path, outcome.run)) == []
        assert _view(ledger, cfg).checkpoint is None
        # The run directories hold it nowhere, nor the ledger's own bytes.
        assert not (tmp_path / "runs" / outcome.run).exists()
        assert _files_holding(tmp_path / "runs") == []
        if engine == "sqlite":
            ledger.close()
            files = [p for p in tmp_path.glob("ledger.db*") if p.is_file()]
            assert files
            assert [p.name for p in files if any(n in p.read_bytes() for n in NEEDLES)] == []
            with sqlite3.connect(tmp_path / "ledger.db") as conn:  # the file is still sound
                assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            ledger = open_ledger(url)
        else:
            assert _postgres_tables_holding(url) == []
    finally:
        ledger.close()
