"""The SQLite ledger's DDL, in one place: the current schema (:data:`SCHEMA`, what a new ledger
is created with), the migrations that bring an older ledger to it, in order, the version they
reach, and the key of a row in the full-text index. ``tests/test_ledger_ddl.py`` checks that
the migrations replayed from an empty database give exactly :data:`SCHEMA`."""

from __future__ import annotations

__all__ = ["FTS_KEY_SPAN", "MIGRATIONS", "SCHEMA", "SCHEMA_VERSION"]

# Seqs per session in rows_fts's rowids (migration 7): a row's key there is FTS_KEY_SPAN times
# its session's number plus its seq.
FTS_KEY_SPAN = 2**32

# Each entry migrates from version i to i + 1. Append, never edit: a ledger on disk replays them.
# usage (tether.ledger.usage), in the migrations and the schema alike.
RUN_USAGE = """
    CREATE TABLE run_usage (
        run           TEXT NOT NULL,
        part          TEXT NOT NULL CHECK (part IN ('task', 'checkpoint')),
        session       TEXT NOT NULL,
        actor         TEXT,
        agent         TEXT NOT NULL,
        model         TEXT,
        at            REAL NOT NULL,
        calls         INTEGER NOT NULL DEFAULT 0,
        input         INTEGER NOT NULL DEFAULT 0,
        output        INTEGER NOT NULL DEFAULT 0,
        cache_read    INTEGER NOT NULL DEFAULT 0,
        cache_write   INTEGER NOT NULL DEFAULT 0,
        total_tokens  INTEGER NOT NULL DEFAULT 0,
        cost          REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (run, part)
    );
    CREATE INDEX run_usage_by_actor ON run_usage (actor, at);
    CREATE INDEX run_usage_by_time ON run_usage (at);
"""

# ---- chat bridges (tether.ledger.bridges, docs/bridges.md): a block of its own ----
# A thread's session, each bridge's sync position, the platform events that became runs,
# and the outbox of the messages a bridge posts (claimed under a lease; ``txn`` makes the
# platform's transaction ids, so a retry repeats the same event). In the migrations and the
# schema alike.
BRIDGES = """
    CREATE TABLE bridge_threads (
        bridge   TEXT NOT NULL,
        room     TEXT NOT NULL,
        root     TEXT NOT NULL,
        session  TEXT NOT NULL,
        agent    TEXT NOT NULL,
        created  TEXT NOT NULL,
        PRIMARY KEY (bridge, room, root)
    );
    CREATE TABLE bridge_cursors (
        bridge  TEXT PRIMARY KEY,
        token   TEXT NOT NULL,
        at      TEXT NOT NULL
    );
    CREATE TABLE bridge_events (
        bridge    TEXT NOT NULL,
        event     TEXT NOT NULL,
        room      TEXT NOT NULL,
        root      TEXT NOT NULL,
        run       TEXT NOT NULL,
        answered  INTEGER NOT NULL DEFAULT 0,
        at        TEXT NOT NULL,
        PRIMARY KEY (bridge, event)
    );
    CREATE INDEX bridge_events_open ON bridge_events (bridge, at) WHERE answered = 0;
    CREATE INDEX bridge_events_by_run ON bridge_events (bridge, run);
    CREATE TABLE bridge_outbox (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        bridge      TEXT NOT NULL,
        key         TEXT NOT NULL,
        room        TEXT NOT NULL,
        root        TEXT NOT NULL,
        kind        TEXT NOT NULL CHECK (kind IN ('answer', 'notice')),
        body        TEXT NOT NULL,
        txn         TEXT NOT NULL,
        state       TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'failed')),
        parts_sent  INTEGER NOT NULL DEFAULT 0,
        attempts    INTEGER NOT NULL DEFAULT 0,
        due         REAL NOT NULL,
        owner       TEXT,
        last_error  TEXT,
        created     TEXT NOT NULL,
        done_at     TEXT,
        UNIQUE (bridge, key)
    );
    CREATE INDEX bridge_outbox_due ON bridge_outbox (bridge, due) WHERE state = 'pending';
"""
# ---- end of chat bridges ----

MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id        TEXT PRIMARY KEY,
        created   TEXT NOT NULL,
        last_seq  INTEGER NOT NULL DEFAULT 0,
        refusing  TEXT,
        extra     TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE runs (
        ord          INTEGER PRIMARY KEY AUTOINCREMENT,
        id           TEXT NOT NULL UNIQUE,
        session      TEXT NOT NULL REFERENCES sessions(id),
        agent        TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN
                         ('queued', 'running', 'finished', 'failed', 'interrupted')),
        request_seq  INTEGER,
        started      TEXT,
        ended        TEXT,
        epoch        INTEGER NOT NULL DEFAULT 0,
        extra        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX runs_by_session ON runs (session, ord);
    CREATE INDEX runs_ended ON runs (session, agent, ord)
        WHERE status IN ('finished', 'failed', 'interrupted');
    CREATE TABLE rows (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session      TEXT NOT NULL REFERENCES sessions(id),
        seq          INTEGER NOT NULL,
        run          TEXT REFERENCES runs(id),
        actor        TEXT NOT NULL,
        kind         TEXT NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT NOT NULL,
        sources      TEXT NOT NULL DEFAULT '[]',
        bytes        INTEGER NOT NULL,
        media_bytes  INTEGER NOT NULL DEFAULT 0,
        entry_id     TEXT,
        extra        TEXT NOT NULL DEFAULT '{}',
        text         TEXT NOT NULL DEFAULT '',
        UNIQUE (session, seq)
    );
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE TABLE notes (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        session  TEXT NOT NULL REFERENCES sessions(id),
        agent    TEXT NOT NULL,
        text     TEXT NOT NULL,
        at       TEXT NOT NULL,
        bytes    INTEGER NOT NULL,
        extra    TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX notes_by_agent ON notes (session, agent, id);
    """,
    # 2: the follow-up view asks whether a run wrote any row (SqlLedger.run_first_seq).
    "CREATE INDEX rows_by_run ON rows (run, seq);",
    # 3: the tail reads row sizes before bodies (SqlLedger.tail); this index covers that scan.
    "CREATE INDEX rows_sizes ON rows (session, seq, bytes);",
    # 4: session custody (docs/architecture.md#custody): leases, placements, idempotent requests,
    # the queue.
    """
    ALTER TABLE runs ADD COLUMN lease_expires REAL;
    ALTER TABLE runs ADD COLUMN owner TEXT;
    ALTER TABLE runs ADD COLUMN placement TEXT;
    ALTER TABLE runs ADD COLUMN request_id TEXT;
    CREATE UNIQUE INDEX runs_by_request ON runs (session, request_id)
        WHERE request_id IS NOT NULL;
    CREATE INDEX runs_queued ON runs (session, ord) WHERE status = 'queued';
    CREATE INDEX runs_live ON runs (session) WHERE status = 'running';
    """,
    # 5: recall's full-text index: FTS5 over rows.text as external content (the text is stored
    # once, in rows), kept in sync by triggers, so appends, imports and copies all index it.
    """
    CREATE VIRTUAL TABLE rows_fts USING fts5(
        text, content = 'rows', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER rows_fts_insert AFTER INSERT ON rows BEGIN
        INSERT INTO rows_fts (rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER rows_fts_delete AFTER DELETE ON rows BEGIN
        INSERT INTO rows_fts (rows_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    INSERT INTO rows_fts (rows_fts) VALUES ('rebuild');
    """,
    # 6: a note names the actor of the run that wrote it, the run, and the sources it carries.
    """
    ALTER TABLE notes ADD COLUMN actor TEXT;
    ALTER TABLE notes ADD COLUMN run TEXT;
    ALTER TABLE notes ADD COLUMN sources TEXT NOT NULL DEFAULT '[]';
    """,
    # 7: a search reads its session's part of the full-text index, not every session's matches.
    # Each session gets a number (sessions.num, stable: rowids are not, across VACUUM) and each
    # row a key, FTS_KEY_SPAN * num + seq (rows.fts_key), which is the row's rowid in rows_fts:
    # a session's rows are one rowid range there, which FTS5 seeks to in every doclist. The
    # indexed text and the set of rows are unchanged, so bm25 ranks exactly as before.
    f"""
    ALTER TABLE sessions ADD COLUMN num INTEGER;
    UPDATE sessions SET num = rowid;
    CREATE UNIQUE INDEX sessions_num ON sessions (num);
    CREATE TRIGGER sessions_num AFTER INSERT ON sessions WHEN new.num IS NULL BEGIN
        UPDATE sessions SET num = (SELECT coalesce(max(num), 0) + 1 FROM sessions)
            WHERE id = new.id;
    END;
    ALTER TABLE rows ADD COLUMN fts_key INTEGER;
    UPDATE rows
        SET fts_key = (SELECT num FROM sessions s WHERE s.id = rows.session) * {FTS_KEY_SPAN} + seq;
    CREATE UNIQUE INDEX rows_fts_key ON rows (fts_key);
    DROP TRIGGER rows_fts_insert;
    DROP TRIGGER rows_fts_delete;
    DROP TABLE rows_fts;
    CREATE VIRTUAL TABLE rows_fts USING fts5(
        text, content = 'rows', content_rowid = 'fts_key',
        tokenize = 'unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER rows_fts_insert AFTER INSERT ON rows BEGIN
        INSERT INTO rows_fts (rowid, text) VALUES (new.fts_key, new.text);
    END;
    CREATE TRIGGER rows_fts_delete AFTER DELETE ON rows BEGIN
        INSERT INTO rows_fts (rows_fts, rowid, text) VALUES ('delete', old.fts_key, old.text);
    END;
    INSERT INTO rows_fts (rows_fts) VALUES ('rebuild');
    """,
    # 8: a range read takes each row's size and sources before its body (SqlLedger.row_sizes).
    # The sources are stored after the body, so reading them from the table walks a big body's
    # overflow pages: this index covers that scan, and the tail's (it replaces rows_sizes).
    """
    CREATE INDEX rows_heads ON rows (session, seq, bytes, sources);
    DROP INDEX rows_sizes;
    """,
    # 9: session lifecycle (docs/operations.md#erasure-and-retention): a fork names its parent and
    # the last seq, run (ord)
    # and note (id) it inherits; erasure receipts (when, by whom, the selector, the counts).
    """
    ALTER TABLE sessions ADD COLUMN parent TEXT;
    ALTER TABLE sessions ADD COLUMN fork_seq INTEGER;
    ALTER TABLE sessions ADD COLUMN fork_ord INTEGER;
    ALTER TABLE sessions ADD COLUMN fork_note INTEGER;
    CREATE INDEX sessions_by_parent ON sessions (parent) WHERE parent IS NOT NULL;
    CREATE TABLE erasures (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        at        TEXT NOT NULL,
        actor     TEXT NOT NULL,
        selector  TEXT NOT NULL,
        counts    TEXT NOT NULL
    );
    """,
    # 10: the ledger fills rows_fts itself, with one statement per insert of rows
    # (SQLiteLedger._insert_rows), in the same transaction as the rows: the per-row trigger made
    # FTS5 write an index segment at every statement of rows, and merge them again. Every writer
    # of rows goes through _insert_rows; deletions still go through the trigger.
    "DROP TRIGGER rows_fts_insert;",
    # 11: a row's full-text key is its rowid. The key (FTS_KEY_SPAN * its session's number + seq)
    # is unique as (session, seq) is, and orders rows by session and seq. The table was indexed
    # three times over for what the key now gives once (rows.id with AUTOINCREMENT's counter,
    # the unique (session, seq) index, rows_fts_key), and every append paid for each.
    # (session, seq) stays unique through the key and its checks; rows_heads serves the reads by
    # session and seq. rows_fts is kept as it is: its rowids are the same keys.
    f"""
    DROP TRIGGER rows_fts_delete;
    CREATE TABLE rows_keyed (
        fts_key      INTEGER PRIMARY KEY,
        session      TEXT NOT NULL REFERENCES sessions(id),
        seq          INTEGER NOT NULL CHECK (seq BETWEEN 1 AND {FTS_KEY_SPAN - 1}),
        run          TEXT REFERENCES runs(id),
        actor        TEXT NOT NULL,
        kind         TEXT NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT NOT NULL,
        sources      TEXT NOT NULL DEFAULT '[]',
        bytes        INTEGER NOT NULL,
        media_bytes  INTEGER NOT NULL DEFAULT 0,
        entry_id     TEXT,
        extra        TEXT NOT NULL DEFAULT '{{}}',
        text         TEXT NOT NULL DEFAULT '',
        CHECK (fts_key % {FTS_KEY_SPAN} = seq)
    );
    INSERT INTO rows_keyed (fts_key, session, seq, run, actor, kind, body, sources, bytes,
            media_bytes, entry_id, extra, text)
        SELECT coalesce(r.fts_key, s.num * {FTS_KEY_SPAN} + r.seq), r.session, r.seq, r.run,
            r.actor, r.kind, r.body, r.sources, r.bytes, r.media_bytes, r.entry_id, r.extra,
            r.text
        FROM rows r JOIN sessions s ON s.id = r.session ORDER BY 1;
    DROP TABLE rows;
    DELETE FROM sqlite_sequence WHERE name = 'rows';
    ALTER TABLE rows_keyed RENAME TO rows;
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE INDEX rows_by_run ON rows (run, seq);
    CREATE INDEX rows_heads ON rows (session, seq, bytes, sources);
    CREATE TRIGGER rows_fts_delete AFTER DELETE ON rows BEGIN
        INSERT INTO rows_fts (rows_fts, rowid, text) VALUES ('delete', old.fts_key, old.text);
    END;
    """,
    # 12: what one actor may ask for ([service.limits], tether.ledger.limits): each run names
    # its requesting actor and when it was created (seconds since the epoch), so the actor's
    # queued and live runs and its requests of the last minute are index reads. Runs still
    # queued or running take their actor from their request; older runs keep neither.
    """
    ALTER TABLE runs ADD COLUMN actor TEXT;
    ALTER TABLE runs ADD COLUMN created_epoch REAL;
    UPDATE runs SET actor = json_extract(extra, '$.request.actor')
        WHERE status IN ('queued', 'running') AND json_valid(extra);
    CREATE INDEX runs_open_by_actor ON runs (actor, status)
        WHERE status IN ('queued', 'running');
    CREATE INDEX runs_by_actor ON runs (actor, created_epoch) WHERE actor IS NOT NULL;
    """,
    # 13: webhooks (tether.ledger.outbox): a run's end is an event, written in the transaction
    # that ends the run; a delivering process fans each event out into one delivery per
    # endpoint, and delivers and retries those (``due``: when the next attempt is, or while one
    # is in flight, when its lease lapses).
    """
    CREATE TABLE webhook_events (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id  TEXT NOT NULL UNIQUE,
        kind      TEXT NOT NULL,
        run       TEXT NOT NULL,
        session   TEXT NOT NULL,
        status    TEXT NOT NULL,
        at        TEXT NOT NULL,
        fanned    INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX webhook_events_by_run ON webhook_events (run, kind);
    CREATE INDEX webhook_events_unfanned ON webhook_events (id) WHERE fanned = 0;
    CREATE TABLE webhook_deliveries (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        event        INTEGER NOT NULL REFERENCES webhook_events(id),
        endpoint     TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
        attempts     INTEGER NOT NULL DEFAULT 0,
        due          REAL NOT NULL,
        owner        TEXT,
        last_status  INTEGER,
        last_error   TEXT,
        done_at      TEXT,
        UNIQUE (event, endpoint)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint, due)
        WHERE state = 'pending';
    """,
    # 14: usage (tether.ledger.usage): one row per run and part (task, checkpoint), written
    # with the run's end (and as it goes when its actor has a budget), summed by actor, agent
    # and model; ``at`` is when the run was requested (its budget's day).
    RUN_USAGE,
    # chat bridges (BRIDGES above)
    BRIDGES,
]
SCHEMA_VERSION = len(MIGRATIONS)

# The schema the migrations reach, as one script: a new ledger is created with it. Change it only
# with a new migration (tests/test_ledger_ddl.py compares the two).
SCHEMA = (
    """
    CREATE TABLE sessions (
        id        TEXT PRIMARY KEY,
        created   TEXT NOT NULL,
        last_seq  INTEGER NOT NULL DEFAULT 0,
        refusing  TEXT,
        extra     TEXT NOT NULL DEFAULT '{}',
        num       INTEGER,
        parent    TEXT,
        fork_seq  INTEGER,
        fork_ord  INTEGER,
        fork_note INTEGER
    );
    CREATE UNIQUE INDEX sessions_num ON sessions (num);
    CREATE INDEX sessions_by_parent ON sessions (parent) WHERE parent IS NOT NULL;
    CREATE TRIGGER sessions_num AFTER INSERT ON sessions WHEN new.num IS NULL BEGIN
        UPDATE sessions SET num = (SELECT coalesce(max(num), 0) + 1 FROM sessions)
            WHERE id = new.id;
    END;
    CREATE TABLE runs (
        ord            INTEGER PRIMARY KEY AUTOINCREMENT,
        id             TEXT NOT NULL UNIQUE,
        session        TEXT NOT NULL REFERENCES sessions(id),
        agent          TEXT NOT NULL,
        status         TEXT NOT NULL CHECK (status IN
                           ('queued', 'running', 'finished', 'failed', 'interrupted')),
        request_seq    INTEGER,
        started        TEXT,
        ended          TEXT,
        epoch          INTEGER NOT NULL DEFAULT 0,
        extra          TEXT NOT NULL DEFAULT '{}',
        lease_expires  REAL,
        owner          TEXT,
        placement      TEXT,
        request_id     TEXT,
        actor          TEXT,
        created_epoch  REAL
    );
    CREATE INDEX runs_by_session ON runs (session, ord);
    CREATE INDEX runs_ended ON runs (session, agent, ord)
        WHERE status IN ('finished', 'failed', 'interrupted');
    CREATE UNIQUE INDEX runs_by_request ON runs (session, request_id)
        WHERE request_id IS NOT NULL;
    CREATE INDEX runs_queued ON runs (session, ord) WHERE status = 'queued';
    CREATE INDEX runs_live ON runs (session) WHERE status = 'running';
    CREATE INDEX runs_open_by_actor ON runs (actor, status)
        WHERE status IN ('queued', 'running');
    CREATE INDEX runs_by_actor ON runs (actor, created_epoch) WHERE actor IS NOT NULL;
    CREATE TABLE "rows" (
        fts_key      INTEGER PRIMARY KEY,
        session      TEXT NOT NULL REFERENCES sessions(id),
        seq          INTEGER NOT NULL CHECK (seq BETWEEN 1 AND 4294967295),
        run          TEXT REFERENCES runs(id),
        actor        TEXT NOT NULL,
        kind         TEXT NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT NOT NULL,
        sources      TEXT NOT NULL DEFAULT '[]',
        bytes        INTEGER NOT NULL,
        media_bytes  INTEGER NOT NULL DEFAULT 0,
        entry_id     TEXT,
        extra        TEXT NOT NULL DEFAULT '{}',
        text         TEXT NOT NULL DEFAULT '',
        CHECK (fts_key % 4294967296 = seq)
    );
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE INDEX rows_by_run ON rows (run, seq);
    CREATE INDEX rows_heads ON rows (session, seq, bytes, sources);
    CREATE VIRTUAL TABLE rows_fts USING fts5(
        text, content = 'rows', content_rowid = 'fts_key',
        tokenize = 'unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER rows_fts_delete AFTER DELETE ON rows BEGIN
        INSERT INTO rows_fts (rows_fts, rowid, text) VALUES ('delete', old.fts_key, old.text);
    END;
    CREATE TABLE notes (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        session  TEXT NOT NULL REFERENCES sessions(id),
        agent    TEXT NOT NULL,
        text     TEXT NOT NULL,
        at       TEXT NOT NULL,
        bytes    INTEGER NOT NULL,
        extra    TEXT NOT NULL DEFAULT '{}',
        actor    TEXT,
        run      TEXT,
        sources  TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX notes_by_agent ON notes (session, agent, id);
    CREATE TABLE erasures (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        at        TEXT NOT NULL,
        actor     TEXT NOT NULL,
        selector  TEXT NOT NULL,
        counts    TEXT NOT NULL
    );
    CREATE TABLE webhook_events (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id  TEXT NOT NULL UNIQUE,
        kind      TEXT NOT NULL,
        run       TEXT NOT NULL,
        session   TEXT NOT NULL,
        status    TEXT NOT NULL,
        at        TEXT NOT NULL,
        fanned    INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX webhook_events_by_run ON webhook_events (run, kind);
    CREATE INDEX webhook_events_unfanned ON webhook_events (id) WHERE fanned = 0;
    CREATE TABLE webhook_deliveries (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        event        INTEGER NOT NULL REFERENCES webhook_events(id),
        endpoint     TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
        attempts     INTEGER NOT NULL DEFAULT 0,
        due          REAL NOT NULL,
        owner        TEXT,
        last_status  INTEGER,
        last_error   TEXT,
        done_at      TEXT,
        UNIQUE (event, endpoint)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint, due)
        WHERE state = 'pending';
"""
    + RUN_USAGE
    + BRIDGES
)
