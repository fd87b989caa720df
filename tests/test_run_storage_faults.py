"""Storage faults during ``tether run`` (issue 12): a full filesystem, a revoked permission and a
terminated backend, each mid-run, with the real pi and the scripted provider. Afterwards the
ledger is consistent (dense seqs, the run ended, the answer kept) and the next run works."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import support
from pg import TEST_URL, fresh_schema_url
from provider import Step, route
from support import RecordedRequest, Reply, ScriptedProvider, ToolCall, run_args, tether, tmpfs
from tether.harness.stranded import keep_stranded_end, record_stranded_ends
from tether.ledger import Ledger, RunStatus, open_ledger


def write_config(tmp: Path, provider_url: str, ledger_url: str, retry_s: float = 30) -> Path:
    return support.write_config(
        tmp,
        provider_url,
        ledger={"url": ledger_url},
        harness={"runs_dir": f"{tmp}/runs", "storage_retry_s": retry_s},
    )


def run(tmp: Path, cfg: Path, request: str) -> subprocess.CompletedProcess[str]:
    return tether(*run_args(cfg, request, as_json=True), cwd=tmp, timeout=180)


def _consistent(ledger: Ledger) -> None:
    """Dense seqs from 1, every run ended."""
    last = ledger.last_seq("s1")
    assert [r.seq for r in ledger.iter_rows("s1")] == list(range(1, last + 1))
    for r in ledger.runs("s1"):
        assert r.status is not RunStatus.RUNNING, r


def _texts(ledger: Ledger) -> list[str]:
    out = []
    for row in ledger.iter_rows("s1"):
        content = row.body.get("content")
        if isinstance(content, list):
            out += [b.get("text", "") for b in content if b.get("type") == "text"]
    return out


def _answering(fault: Callable[[], None], answer: str = "the answer") -> list[Step | Any]:
    """A tool call, then (as pi asks for the answer) the fault, then the answer."""

    def second(request: RecordedRequest) -> Step:
        fault()
        return Reply(answer)

    return [Reply(tool_calls=[ToolCall("bash", {"command": "echo hi"})]), second]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "4m") as mnt:
        yield mnt


def _fill(where: Path) -> Path:
    ballast = where / "ballast"
    # Unbuffered: a buffered file keeps the bytes the full disk refused and raises ENOSPC again
    # when it is closed, out of the provider's script (pi then retries the request).
    with ballast.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return ballast


def test_a_disk_full_for_a_while_delays_the_answer_and_loses_nothing(
    tmp_path: Path, small_fs: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    def fault() -> None:
        ballast = _fill(small_fs)
        threading.Timer(1.5, ballast.unlink).start()  # an operator frees space

    p = scripted_provider(_answering(fault))
    cfg = write_config(tmp_path, p.url, f"sqlite:{small_fs}/ledger.db")
    done = run(tmp_path, cfg, "go")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "finished"
    assert out["answer"] == "the answer"
    with open_ledger(f"sqlite:{small_fs}/ledger.db") as ledger:
        _consistent(ledger)
        assert _texts(ledger)[-1] == "the answer"  # the answer reached the ledger
        assert ledger.get_run(out["run"]).extra["storage_retries"] >= 1  # the fault did happen
    again = run(tmp_path, cfg, "next")
    assert again.returncode == 4  # the script is exhausted: the provider fails, not the ledger
    assert json.loads(again.stdout)["status"] == "failed"


def test_a_disk_that_stays_full_ends_the_run_and_names_where_the_answer_is(
    tmp_path: Path, small_fs: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    ballasts: list[Path] = []
    p = scripted_provider([*_answering(lambda: ballasts.append(_fill(small_fs))), Reply("next")])
    cfg = write_config(tmp_path, p.url, f"sqlite:{small_fs}/ledger.db", retry_s=1)
    done = run(tmp_path, cfg, "go")
    assert done.returncode == 4
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["answer"] == "the answer"  # printed: the ledger could not take it
    stranded = tmp_path / "runs" / "unrecorded" / f"{out['run']}.json"
    assert str(stranded) in out["error"]  # not even the run's end fit: it waits there
    assert stranded.exists()
    assert out["status"] == "failed"
    assert out["stop_reason"] == "storage_error"
    session_file = tmp_path / "runs" / out["run"] / "session.jsonl"
    assert str(session_file) in out["error"]
    assert "the answer" in session_file.read_text()  # kept where the error says
    # space again: the next run records the stranded run's end, then runs
    ballasts[0].unlink()
    again = run(tmp_path, cfg, "next")
    assert again.returncode == 0, again.stderr
    assert not stranded.exists()
    with open_ledger(f"sqlite:{small_fs}/ledger.db") as ledger:
        _consistent(ledger)
        first = ledger.get_run(out["run"])
        assert first.status is RunStatus.FAILED
        assert first.extra["answer"] == "the answer"
        assert first.extra["stop_reason"] == "storage_error"


@pytest.fixture
def limited_pg() -> Iterator[tuple[str, str, str]]:
    """(ledger URL as a non-superuser role, the role, the schema): a superuser ignores
    privileges, so the revoked one is a plain role's."""
    role = f"tether_{uuid.uuid4().hex[:10]}"
    with fresh_schema_url() as admin_url:
        schema = admin_url.split("search_path%3D")[-1]
        open_ledger(admin_url).close()
        with psycopg.connect(TEST_URL, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            admin.execute(
                f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}"
            )
        try:
            yield admin_url.replace("postgresql://postgres@", f"postgresql://{role}@"), role, schema
        finally:
            with psycopg.connect(TEST_URL, autocommit=True) as admin:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


def test_a_revoked_permission_mid_run_ends_the_run_with_the_answer_kept(
    tmp_path: Path,
    limited_pg: tuple[str, str, str],
    scripted_provider: Callable[..., ScriptedProvider],
) -> None:
    url, role, schema = limited_pg

    def revoke() -> None:
        with psycopg.connect(TEST_URL, autocommit=True) as admin:
            admin.execute(f"REVOKE INSERT ON {schema}.rows FROM {role}")

    p = scripted_provider([*_answering(revoke), Reply("the next answer")])
    cfg = write_config(tmp_path, p.url, url, retry_s=1)
    done = run(tmp_path, cfg, "go")
    assert done.returncode == 4
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["answer"] == "the answer"
    assert out["stop_reason"] == "storage_error"
    assert "permission denied" in out["error"]
    with open_ledger(url) as ledger:
        _consistent(ledger)  # ended although rows could not be written: runs may be updated
        ended = ledger.get_run(out["run"])
        assert ended.status is RunStatus.FAILED
        assert ended.extra["answer"] == "the answer"
    with psycopg.connect(TEST_URL, autocommit=True) as admin:
        admin.execute(f"GRANT INSERT ON {schema}.rows TO {role}")
    again = run(tmp_path, cfg, "next")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["answer"] == "the next answer"
    with open_ledger(url) as ledger:
        _consistent(ledger)


def test_a_terminated_backend_mid_run_is_reconnected_and_the_answer_written(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    marker = f"tether-test-{uuid.uuid4().hex[:8]}"
    terminated: list[int] = []

    def terminate() -> None:
        with psycopg.connect(TEST_URL, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (marker,),
            ).fetchone()
        terminated.append(int(row[0]) if row else 0)

    p = scripted_provider(_answering(terminate))
    with fresh_schema_url() as base:
        url = f"{base}&application_name={marker}"
        cfg = write_config(tmp_path, p.url, url)
        done = run(tmp_path, cfg, "go")
        assert terminated[0] >= 1  # the run's connections were cut
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["answer"] == "the answer"
        with open_ledger(url) as ledger:
            _consistent(ledger)
            assert _texts(ledger)[-1] == "the answer"
            assert ledger.get_run(out["run"]).status is RunStatus.FINISHED


def test_a_kept_end_whose_refusal_did_not_land_is_refused_on_the_next_pass(
    ledger: Ledger, tmp_path: Path
) -> None:
    # A pass wrote the kept end, then the refusal after it failed: the next pass finds the run
    # ended already, and must still refuse the session (pi's idle was never confirmed).
    ledger.ensure_session("s1")
    fence = ledger.claim_run(ledger.create_run("s1", "rev").id)
    keep_stranded_end(
        tmp_path / "runs", fence, RunStatus.INTERRUPTED, {"answer": None}, "pi's idle unconfirmed"
    )
    ledger.end_run(fence, RunStatus.INTERRUPTED, extra={"answer": None})
    assert record_stranded_ends(ledger, tmp_path / "runs") == 1
    session = ledger.session("s1")
    assert session is not None
    assert session.refusing == "pi's idle unconfirmed"
    assert record_stranded_ends(ledger, tmp_path / "runs") == 0, "recorded once"


def test_a_disk_that_fills_mid_summary_leaves_a_tried_checkpoint_the_next_run_records(
    tmp_path: Path, small_fs: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """The ledger's disk fills while pi makes the continuation checkpoint's summary and stays
    full past the storage retries: the run ends with its answer printed. Once there is space,
    the next run, owning the session, records that the checkpoint was tried and how it ended
    (refused, a receipt row) and that context may require recall; its own view's notice says
    so."""
    ballasts: list[Path] = []

    def summary(request: RecordedRequest) -> Step:
        ballasts.append(_fill(small_fs))
        return Reply("## Goal\nNEVER STORED")

    p = scripted_provider(
        route(
            task=[
                Reply(tool_calls=[ToolCall("bash", {"command": "seq 1 3000"})]),
                Reply("the answer"),
                Reply("next answer"),
            ],
            summary=[summary],
        )
    )
    cfg = support.write_config(
        tmp_path,
        p.url,
        ledger={"url": f"sqlite:{small_fs}/ledger.db"},
        followup={"budget_bytes": 4000},
        agents={"rev": {"checkpoint_min_time_s": 0, "tools": ["bash"]}},
        harness={"runs_dir": f"{tmp_path}/runs", "storage_retry_s": 1},
    )
    done = run(tmp_path, cfg, "go")
    out = json.loads(done.stdout)
    assert out["answer"] == "the answer", done.stderr
    assert len(p.summary_requests) == 1
    ballasts[0].unlink()
    again = run(tmp_path, cfg, "next")
    assert again.returncode == 0, again.stderr
    with open_ledger(f"sqlite:{small_fs}/ledger.db") as ledger:
        _consistent(ledger)
        first = ledger.get_run(out["run"])
        assert first.extra["answer"] == "the answer"
        assert first.extra["checkpoint"] == "refused:cancelled", first.extra
        assert first.extra["checkpoint_decision"] == {"decision": "refused", "reason": "cancelled"}
        assert first.extra["needs_recall"] is True
        receipts = [r.body for r in ledger.iter_rows("s1") if r.body.get("run") == out["run"]]
        assert {
            "kind": "continuation_checkpoint_refused",
            "run": out["run"],
            "reason": "cancelled",
        } in receipts
    notice = f"Run {out['run']} could not write a continuation checkpoint (cancelled)"
    assert p.task_requests[-1].contains(notice)
