"""Storage faults at the ledger's edge (issue 12): a full filesystem, a revoked permission, a
terminated backend. Each is one StorageError naming the ledger and what to do (never a sqlite3
or psycopg error), the ledger stays consistent (dense seqs), and it works again afterwards."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pg import TEST_URL, fresh_schema_url
from tether.errors import StorageError
from tether.ledger import NewRow, open_ledger
from tether.ledger.postgres import PostgresLedger


def _msg(i: int, size: int = 2000) -> NewRow:
    return NewRow.message("agent:a", {"role": "user", "content": f"{i} " + "x" * size})


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs: a real filesystem that fills up."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_filesystem_is_one_clear_error_and_the_ledger_stays_whole(small_fs: Path) -> None:
    path = small_fs / "ledger.db"
    ledger = open_ledger(f"sqlite:{path}")
    ledger.create_session("s")
    fence = ledger.claim_run(ledger.create_run("s", "a").id)
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\0" * (2 * 1024 * 1024))
    appended = 0
    failure: StorageError | None = None
    for i in range(10_000):
        try:
            ledger.append(fence, [_msg(i)])
        except StorageError as exc:
            failure = exc
            break
        appended += 1
    assert failure is not None
    message = str(failure)
    assert str(path) in message
    assert "full" in message
    assert "free space" in message
    assert "\n" not in message
    assert ledger.last_seq("s") == appended  # the failed append left nothing behind
    assert [r.seq for r in ledger.iter_rows("s")] == list(range(1, appended + 1))
    ballast.unlink()  # space again: the same ledger object works on
    row = ledger.append(fence, [_msg(-1)])[0]
    assert row.seq == appended + 1
    ledger.close()


@pytest.fixture
def limited_role() -> Iterator[tuple[str, str]]:
    """A login role that is not a superuser (a superuser ignores privileges), owning nothing:
    tether's tables are made by the admin and granted to it. Yields (URL as the role, schema)."""
    role = f"tether_{uuid.uuid4().hex[:10]}"
    with fresh_schema_url() as admin_url:
        schema = admin_url.split("search_path%3D")[-1]
        with psycopg.connect(TEST_URL, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        open_ledger(admin_url).close()  # the admin creates the tables
        with psycopg.connect(TEST_URL, autocommit=True) as admin:
            admin.execute(f"SET search_path = {schema}")
            admin.execute(
                f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}"
            )
        user_url = admin_url.replace("postgresql://postgres@", f"postgresql://{role}@")
        try:
            yield user_url, schema
        finally:
            with psycopg.connect(TEST_URL, autocommit=True) as admin:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


def test_a_revoked_permission_is_one_clear_error(limited_role: tuple[str, str]) -> None:
    url, schema = limited_role
    ledger = open_ledger(url)
    ledger.create_session("s")
    fence = ledger.claim_run(ledger.create_run("s", "a").id)
    ledger.append(fence, [_msg(1)], request=True)
    with psycopg.connect(TEST_URL, autocommit=True) as admin:
        admin.execute(f"REVOKE INSERT ON {schema}.rows FROM {url.split('//')[1].split('@')[0]}")
    with pytest.raises(StorageError) as info:
        ledger.append(fence, [_msg(2)])
    message = str(info.value)
    assert "permission denied" in message
    assert "grant" in message
    assert "\n" not in message
    assert ledger.last_seq("s") == 1  # the refused append rolled back its seq too
    # reads still work, and the run can still be ended: no run is left running
    assert ledger.get_run(fence.run).status.value == "running"
    from tether.ledger import RunStatus

    ledger.end_run(fence, RunStatus.FAILED, extra={"error": message})
    assert ledger.get_run(fence.run).status is RunStatus.FAILED
    ledger.close()


def _terminate(url_marker: str) -> int:
    """Terminate every backend of the test database but ours: what a failover or an operator's
    pg_terminate_backend does to tether's pooled connections."""
    with psycopg.connect(TEST_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND application_name = %s",
            (url_marker,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_terminated_backend_is_reconnected_and_the_write_retried() -> None:
    marker = f"tether-test-{uuid.uuid4().hex[:8]}"
    with fresh_schema_url() as base:
        url = f"{base}&application_name={marker}"
        ledger = open_ledger(url)
        assert isinstance(ledger, PostgresLedger)
        ledger.create_session("s")
        fence = ledger.claim_run(ledger.create_run("s", "a").id)
        ledger.append(fence, [_msg(0)], request=True)
        for i in range(1, 6):
            assert _terminate(marker) >= 1
            rows = ledger.append(fence, [_msg(i)])
            assert rows[0].seq == i + 1
        # an append repeated after its acknowledgement was lost does not duplicate
        again = ledger.append(
            fence, [NewRow.message("agent:a", {"role": "user", "content": "e"}, entry_id="e1")]
        )
        assert _terminate(marker) >= 1
        same = ledger.append(
            fence, [NewRow.message("agent:a", {"role": "user", "content": "e"}, entry_id="e1")]
        )
        assert same[0].seq == again[0].seq
        assert ledger.last_seq("s") == 7
        assert [r.seq for r in ledger.iter_rows("s")] == list(range(1, 8))
        ledger.close()


def test_a_write_that_is_not_idempotent_is_not_tried_again_on_a_lost_connection() -> None:
    # A lost connection may have lost a commit's acknowledgement: a note written again would
    # be a second note. The caller gets ConnectionLost and decides; the ledger does not retry.
    marker = f"tether-test-{uuid.uuid4().hex[:8]}"
    with fresh_schema_url() as base:
        ledger = open_ledger(f"{base}&application_name={marker}")
        assert isinstance(ledger, PostgresLedger)
        ledger.create_session("s")
        ledger.add_note("s", "a", "first")
        assert _terminate(marker) >= 1
        with pytest.raises(StorageError):
            ledger.add_note("s", "a", "second")
        # (the backend was gone before the insert: nothing of it committed)
        assert sorted(n.text for n in ledger.notes("s", "a")) == ["first"]
        ledger.add_note("s", "a", "third")  # a new connection
        assert sorted(n.text for n in ledger.notes("s", "a")) == ["first", "third"]
        ledger.close()
