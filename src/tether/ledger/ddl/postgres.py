"""The PostgreSQL ledger's DDL, in one place: the current schema (:data:`SCHEMA`, what a new
ledger is created with), the migrations that bring an older ledger to it, in order, the version
they reach, and the full-text document the search index holds. ``tests/test_ledger_ddl.py``
checks that the migrations replayed from an empty schema give exactly :data:`SCHEMA`.

Full-text search (recall) reads ``rows.text`` through a GIN index on
:data:`FTS_SESSION_DOCUMENT` (the words of :data:`FTS_DOCUMENT` and a lexeme naming the row's
session); use that exact expression in a query so PostgreSQL uses the index, and AND the words
with the session's lexeme so that it reads that session's matches alone, e.g.
``WHERE FTS_SESSION_DOCUMENT @@ (websearch_to_tsquery('simple', %s) && FTS_SESSION_QUERY)``.
"""

from __future__ import annotations

__all__ = [
    "FTS_DOCUMENT",
    "FTS_MAX_CHARS",
    "FTS_SESSION_DOCUMENT",
    "FTS_SESSION_QUERY",
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
]

# A tsvector may not exceed 1 MB, and to_tsvector raises (failing the append) when it would.
# The worst text measured (two-character CJK words, all distinct) takes 4.7 bytes of tsvector
# per character, so the first 100,000 characters of a row are indexed: at most ~470 KB.
FTS_MAX_CHARS = 100_000
# PostgreSQL's parser keeps paths, host names and file names whole ("kv/quokka", "app.yaml"),
# where SQLite's unicode61 splits them: the characters that join them become spaces first, so a
# word inside them is found on both backends.
_FTS_JOINERS = "/.:@=\\"
FTS_DOCUMENT = (
    f"to_tsvector('simple', translate(left(text, {FTS_MAX_CHARS}), "
    f"'{_FTS_JOINERS}', '{' ' * (len(_FTS_JOINERS))}'))"
)
# The index recall searches (migration 7) holds, beside a row's words, one lexeme naming its
# session: "session " and the md5 of the session id (a space never occurs in a parsed word, and
# the hash keeps the lexeme short whatever the id). A search asks for that lexeme AND its words,
# so the GIN index yields the session's matches alone: its work follows the rarer of the two
# (the session's rows or the words' matches), never other sessions' matches. Ranking still reads
# FTS_DOCUMENT, so it is unchanged.
FTS_SESSION_DOCUMENT = f"({FTS_DOCUMENT} || array_to_tsvector(ARRAY['session ' || md5(session)]))"
FTS_SESSION_QUERY = "('''session ' || md5(?) || '''')::tsquery"
"""The tsquery of a session's lexeme in :data:`FTS_SESSION_DOCUMENT` (its id is the parameter)."""
_FTS_DOCUMENT_V1 = f"to_tsvector('simple', left(text, {FTS_MAX_CHARS}))"

# Each entry migrates from version i to i + 1. Append, never edit: a ledger on disk replays them.
# Bodies, extras and timestamps are TEXT exactly as SQLite stores them (canonical JSON, the
# interchange timestamps), so both backends return byte-identical records; every TEXT column
# collates as "C" (code point order, like SQLite's BINARY), so listings sort the same on both
# whatever the database's locale.
# usage (tether.ledger.usage), in the migrations and the schema alike.
RUN_USAGE = """
    CREATE TABLE run_usage (
        run           TEXT COLLATE "C" NOT NULL,
        part          TEXT COLLATE "C" NOT NULL CHECK (part IN ('task', 'checkpoint')),
        session       TEXT COLLATE "C" NOT NULL,
        actor         TEXT COLLATE "C",
        agent         TEXT COLLATE "C" NOT NULL,
        model         TEXT COLLATE "C",
        at            DOUBLE PRECISION NOT NULL,
        calls         BIGINT NOT NULL DEFAULT 0,
        input         BIGINT NOT NULL DEFAULT 0,
        output        BIGINT NOT NULL DEFAULT 0,
        cache_read    BIGINT NOT NULL DEFAULT 0,
        cache_write   BIGINT NOT NULL DEFAULT 0,
        total_tokens  BIGINT NOT NULL DEFAULT 0,
        cost          DOUBLE PRECISION NOT NULL DEFAULT 0,
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
        bridge   TEXT COLLATE "C" NOT NULL,
        room     TEXT COLLATE "C" NOT NULL,
        root     TEXT COLLATE "C" NOT NULL,
        session  TEXT COLLATE "C" NOT NULL,
        agent    TEXT COLLATE "C" NOT NULL,
        created  TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (bridge, room, root)
    );
    CREATE TABLE bridge_cursors (
        bridge  TEXT COLLATE "C" PRIMARY KEY,
        token   TEXT COLLATE "C" NOT NULL,
        at      TEXT COLLATE "C" NOT NULL
    );
    CREATE TABLE bridge_events (
        bridge    TEXT COLLATE "C" NOT NULL,
        event     TEXT COLLATE "C" NOT NULL,
        room      TEXT COLLATE "C" NOT NULL,
        root      TEXT COLLATE "C" NOT NULL,
        run       TEXT COLLATE "C" NOT NULL,
        answered  INTEGER NOT NULL DEFAULT 0,
        at        TEXT COLLATE "C" NOT NULL,
        PRIMARY KEY (bridge, event)
    );
    CREATE INDEX bridge_events_open ON bridge_events (bridge, at) WHERE answered = 0;
    CREATE INDEX bridge_events_by_run ON bridge_events (bridge, run);
    CREATE TABLE bridge_outbox (
        id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        bridge      TEXT COLLATE "C" NOT NULL,
        key         TEXT COLLATE "C" NOT NULL,
        room        TEXT COLLATE "C" NOT NULL,
        root        TEXT COLLATE "C" NOT NULL,
        kind        TEXT COLLATE "C" NOT NULL CHECK (kind IN ('answer', 'notice')),
        body        TEXT COLLATE "C" NOT NULL,
        txn         TEXT COLLATE "C" NOT NULL,
        state       TEXT COLLATE "C" NOT NULL CHECK (state IN ('pending', 'sent', 'failed')),
        parts_sent  INTEGER NOT NULL DEFAULT 0,
        attempts    INTEGER NOT NULL DEFAULT 0,
        due         DOUBLE PRECISION NOT NULL,
        owner       TEXT COLLATE "C",
        last_error  TEXT COLLATE "C",
        created     TEXT COLLATE "C" NOT NULL,
        done_at     TEXT COLLATE "C",
        UNIQUE (bridge, key)
    );
    CREATE INDEX bridge_outbox_due ON bridge_outbox (bridge, due) WHERE state = 'pending';
"""
# ---- end of chat bridges ----

MIGRATIONS: list[str] = [
    f"""
    CREATE TABLE sessions (
        id        TEXT COLLATE "C" PRIMARY KEY,
        created   TEXT COLLATE "C" NOT NULL,
        last_seq  BIGINT NOT NULL DEFAULT 0,
        refusing  TEXT COLLATE "C",
        extra     TEXT COLLATE "C" NOT NULL DEFAULT '{{}}'
    );
    CREATE TABLE runs (
        ord          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id           TEXT COLLATE "C" NOT NULL UNIQUE,
        session      TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        agent        TEXT COLLATE "C" NOT NULL,
        status       TEXT COLLATE "C" NOT NULL CHECK (status IN
                         ('queued', 'running', 'finished', 'failed', 'interrupted')),
        request_seq  BIGINT,
        started      TEXT COLLATE "C",
        ended        TEXT COLLATE "C",
        epoch        BIGINT NOT NULL DEFAULT 0,
        extra        TEXT COLLATE "C" NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX runs_by_session ON runs (session, ord);
    CREATE INDEX runs_ended ON runs (session, agent, ord)
        WHERE status IN ('finished', 'failed', 'interrupted');
    CREATE TABLE rows (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session      TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        seq          BIGINT NOT NULL,
        run          TEXT COLLATE "C" REFERENCES runs(id),
        actor        TEXT COLLATE "C" NOT NULL,
        kind         TEXT COLLATE "C" NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT COLLATE "C" NOT NULL,
        sources      TEXT COLLATE "C" NOT NULL DEFAULT '[]',
        bytes        BIGINT NOT NULL,
        media_bytes  BIGINT NOT NULL DEFAULT 0,
        entry_id     TEXT COLLATE "C",
        extra        TEXT COLLATE "C" NOT NULL DEFAULT '{{}}',
        text         TEXT COLLATE "C" NOT NULL DEFAULT '',
        UNIQUE (session, seq)
    );
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE INDEX rows_fts ON rows USING gin ({_FTS_DOCUMENT_V1});
    CREATE TABLE notes (
        id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session  TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        agent    TEXT COLLATE "C" NOT NULL,
        text     TEXT COLLATE "C" NOT NULL,
        at       TEXT COLLATE "C" NOT NULL,
        bytes    BIGINT NOT NULL,
        extra    TEXT COLLATE "C" NOT NULL DEFAULT '{{}}'
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
    ALTER TABLE runs ADD COLUMN lease_expires DOUBLE PRECISION;
    ALTER TABLE runs ADD COLUMN owner TEXT COLLATE "C";
    ALTER TABLE runs ADD COLUMN placement TEXT COLLATE "C";
    ALTER TABLE runs ADD COLUMN request_id TEXT COLLATE "C";
    CREATE UNIQUE INDEX runs_by_request ON runs (session, request_id)
        WHERE request_id IS NOT NULL;
    CREATE INDEX runs_queued ON runs (session, ord) WHERE status = 'queued';
    CREATE INDEX runs_live ON runs (session) WHERE status = 'running';
    """,
    # 5: a note names the actor of the run that wrote it, the run, and the sources it carries.
    """
    ALTER TABLE notes ADD COLUMN actor TEXT COLLATE "C";
    ALTER TABLE notes ADD COLUMN run TEXT COLLATE "C";
    ALTER TABLE notes ADD COLUMN sources TEXT COLLATE "C" NOT NULL DEFAULT '[]';
    """,
    # 6: recall's index splits paths and host names into their words (FTS_DOCUMENT).
    f"""
    DROP INDEX rows_fts;
    CREATE INDEX rows_fts ON rows USING gin ({FTS_DOCUMENT});
    """,
    # 7: recall's index names each row's session too (FTS_SESSION_DOCUMENT), so a search reads
    # only its session's matches.
    f"""
    DROP INDEX rows_fts;
    CREATE INDEX rows_fts ON rows USING gin ({FTS_SESSION_DOCUMENT});
    """,
    # 8: session lifecycle (docs/operations.md#erasure-and-retention): a fork names its parent and
    # the last seq, run (ord)
    # and note (id) it inherits; erasure receipts (when, by whom, the selector, the counts).
    """
    ALTER TABLE sessions ADD COLUMN parent TEXT COLLATE "C";
    ALTER TABLE sessions ADD COLUMN fork_seq BIGINT;
    ALTER TABLE sessions ADD COLUMN fork_ord BIGINT;
    ALTER TABLE sessions ADD COLUMN fork_note BIGINT;
    CREATE INDEX sessions_by_parent ON sessions (parent) WHERE parent IS NOT NULL;
    CREATE TABLE erasures (
        id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at        TEXT COLLATE "C" NOT NULL,
        actor     TEXT COLLATE "C" NOT NULL,
        selector  TEXT COLLATE "C" NOT NULL,
        counts    TEXT COLLATE "C" NOT NULL
    );
    """,
    # 9: what one actor may ask for ([service.limits], tether.ledger.limits): each run names
    # its requesting actor and when it was created (seconds since the epoch), so the actor's
    # queued and live runs and its requests of the last minute are index reads. Runs still
    # queued or running take their actor from their request; older runs keep neither.
    """
    ALTER TABLE runs ADD COLUMN actor TEXT COLLATE "C";
    ALTER TABLE runs ADD COLUMN created_epoch DOUBLE PRECISION;
    UPDATE runs SET actor = extra::jsonb -> 'request' ->> 'actor'
        WHERE status IN ('queued', 'running');
    CREATE INDEX runs_open_by_actor ON runs (actor, status)
        WHERE status IN ('queued', 'running');
    CREATE INDEX runs_by_actor ON runs (actor, created_epoch) WHERE actor IS NOT NULL;
    """,
    # 10: webhooks (tether.ledger.outbox): a run's end is an event, written in the transaction
    # that ends the run; a delivering process fans each event out into one delivery per
    # endpoint, and delivers and retries those (``due``: when the next attempt is, or while one
    # is in flight, when its lease lapses).
    """
    CREATE TABLE webhook_events (
        id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id  TEXT COLLATE "C" NOT NULL UNIQUE,
        kind      TEXT COLLATE "C" NOT NULL,
        run       TEXT COLLATE "C" NOT NULL,
        session   TEXT COLLATE "C" NOT NULL,
        status    TEXT COLLATE "C" NOT NULL,
        at        TEXT COLLATE "C" NOT NULL,
        fanned    INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX webhook_events_by_run ON webhook_events (run, kind);
    CREATE INDEX webhook_events_unfanned ON webhook_events (id) WHERE fanned = 0;
    CREATE TABLE webhook_deliveries (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event        BIGINT NOT NULL REFERENCES webhook_events(id),
        endpoint     TEXT COLLATE "C" NOT NULL,
        state        TEXT COLLATE "C" NOT NULL
                         CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
        attempts     INTEGER NOT NULL DEFAULT 0,
        due          DOUBLE PRECISION NOT NULL,
        owner        TEXT COLLATE "C",
        last_status  INTEGER,
        last_error   TEXT COLLATE "C",
        done_at      TEXT COLLATE "C",
        UNIQUE (event, endpoint)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint, due)
        WHERE state = 'pending';
    """,
    # 11: usage (tether.ledger.usage): one row per run and part (task, checkpoint), written
    # with the run's end (and as it goes when its actor has a budget), summed by actor, agent
    # and model; ``at`` is when the run was requested (its budget's day).
    RUN_USAGE,
    # chat bridges (BRIDGES above)
    BRIDGES,
]
SCHEMA_VERSION = len(MIGRATIONS)

# The schema the migrations reach, as one script: a new ledger is created with it. Change it only
# with a new migration (tests/test_ledger_ddl.py compares the two).
SCHEMA = f"""
    CREATE TABLE sessions (
        id        TEXT COLLATE "C" PRIMARY KEY,
        created   TEXT COLLATE "C" NOT NULL,
        last_seq  BIGINT NOT NULL DEFAULT 0,
        refusing  TEXT COLLATE "C",
        extra     TEXT COLLATE "C" NOT NULL DEFAULT '{{}}',
        parent    TEXT COLLATE "C",
        fork_seq  BIGINT,
        fork_ord  BIGINT,
        fork_note BIGINT
    );
    CREATE INDEX sessions_by_parent ON sessions (parent) WHERE parent IS NOT NULL;
    CREATE TABLE runs (
        ord            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id             TEXT COLLATE "C" NOT NULL UNIQUE,
        session        TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        agent          TEXT COLLATE "C" NOT NULL,
        status         TEXT COLLATE "C" NOT NULL CHECK (status IN
                           ('queued', 'running', 'finished', 'failed', 'interrupted')),
        request_seq    BIGINT,
        started        TEXT COLLATE "C",
        ended          TEXT COLLATE "C",
        epoch          BIGINT NOT NULL DEFAULT 0,
        extra          TEXT COLLATE "C" NOT NULL DEFAULT '{{}}',
        lease_expires  DOUBLE PRECISION,
        owner          TEXT COLLATE "C",
        placement      TEXT COLLATE "C",
        request_id     TEXT COLLATE "C",
        actor          TEXT COLLATE "C",
        created_epoch  DOUBLE PRECISION
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
    CREATE TABLE rows (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session      TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        seq          BIGINT NOT NULL,
        run          TEXT COLLATE "C" REFERENCES runs(id),
        actor        TEXT COLLATE "C" NOT NULL,
        kind         TEXT COLLATE "C" NOT NULL CHECK (kind IN ('message', 'compaction', 'receipt')),
        body         TEXT COLLATE "C" NOT NULL,
        sources      TEXT COLLATE "C" NOT NULL DEFAULT '[]',
        bytes        BIGINT NOT NULL,
        media_bytes  BIGINT NOT NULL DEFAULT 0,
        entry_id     TEXT COLLATE "C",
        extra        TEXT COLLATE "C" NOT NULL DEFAULT '{{}}',
        text         TEXT COLLATE "C" NOT NULL DEFAULT '',
        UNIQUE (session, seq)
    );
    CREATE UNIQUE INDEX rows_by_entry ON rows (session, entry_id) WHERE entry_id IS NOT NULL;
    CREATE INDEX rows_compactions ON rows (session, seq) WHERE kind = 'compaction';
    CREATE INDEX rows_by_run ON rows (run, seq);
    CREATE INDEX rows_sizes ON rows (session, seq, bytes);
    CREATE INDEX rows_fts ON rows USING gin ({FTS_SESSION_DOCUMENT});
    CREATE TABLE notes (
        id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session  TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
        agent    TEXT COLLATE "C" NOT NULL,
        text     TEXT COLLATE "C" NOT NULL,
        at       TEXT COLLATE "C" NOT NULL,
        bytes    BIGINT NOT NULL,
        extra    TEXT COLLATE "C" NOT NULL DEFAULT '{{}}',
        actor    TEXT COLLATE "C",
        run      TEXT COLLATE "C",
        sources  TEXT COLLATE "C" NOT NULL DEFAULT '[]'
    );
    CREATE INDEX notes_by_agent ON notes (session, agent, id);
    CREATE TABLE erasures (
        id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at        TEXT COLLATE "C" NOT NULL,
        actor     TEXT COLLATE "C" NOT NULL,
        selector  TEXT COLLATE "C" NOT NULL,
        counts    TEXT COLLATE "C" NOT NULL
    );
    CREATE TABLE webhook_events (
        id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id  TEXT COLLATE "C" NOT NULL UNIQUE,
        kind      TEXT COLLATE "C" NOT NULL,
        run       TEXT COLLATE "C" NOT NULL,
        session   TEXT COLLATE "C" NOT NULL,
        status    TEXT COLLATE "C" NOT NULL,
        at        TEXT COLLATE "C" NOT NULL,
        fanned    INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX webhook_events_by_run ON webhook_events (run, kind);
    CREATE INDEX webhook_events_unfanned ON webhook_events (id) WHERE fanned = 0;
    CREATE TABLE webhook_deliveries (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event        BIGINT NOT NULL REFERENCES webhook_events(id),
        endpoint     TEXT COLLATE "C" NOT NULL,
        state        TEXT COLLATE "C" NOT NULL
                         CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
        attempts     INTEGER NOT NULL DEFAULT 0,
        due          DOUBLE PRECISION NOT NULL,
        owner        TEXT COLLATE "C",
        last_status  INTEGER,
        last_error   TEXT COLLATE "C",
        done_at      TEXT COLLATE "C",
        UNIQUE (event, endpoint)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint, due)
        WHERE state = 'pending';
{RUN_USAGE}{BRIDGES}"""
