"""Full-text search over one session's rows (recall): whole words, any case, best ranked first,
each hit with a snippet. The statement differs by engine (SQLite's FTS5, PostgreSQL's tsvector
and GIN index) and is written here, once; the indexes it reads are in each engine's DDL
(:mod:`tether.ledger.ddl`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tether.ledger import codec
from tether.ledger.base import Engine, SqlBase
from tether.ledger.ddl.postgres import (
    FTS_DOCUMENT,
    FTS_MAX_CHARS,
    FTS_SESSION_DOCUMENT,
    FTS_SESSION_QUERY,
)
from tether.ledger.ddl.sqlite import FTS_KEY_SPAN
from tether.ledger.lineage import lineage
from tether.ledger.models import SearchHit

__all__ = ["MAX_SEARCH_WORDS", "RANK_CANDIDATES", "SearchSql"]

_WORD = re.compile(r"\w+")
MAX_SEARCH_WORDS = 16
"""Words one search looks for: the cap is on the words searched, after splitting (a query of
one token can hold thousands of words, e.g. ``a.b.c…``)."""
# PostgreSQL ranks at most this many matches of a session (ranking re-parses each row's text).
RANK_CANDIDATES = 1000
_R_COLS = ", ".join(f"r.{col}" for col in codec.ROW_COLUMNS)


class SearchSql(SqlBase):
    """Full-text search."""

    def search(
        self,
        session_id: str,
        words: Sequence[str],
        *,
        first: int = 1,
        last: int = 2**62,
        limit: int = 8,
        offset: int = 0,
        snippet_chars: int = 400,
    ) -> list[SearchHit]:
        """Rows of a session whose text holds any of ``words`` (whole words, any case), best
        ranked first, each with a snippet around the match. Words are passed as values, never
        as query syntax; a word that is not made of letters, digits or ``_`` is split into
        those it contains, and the first :data:`MAX_SEARCH_WORDS` words are searched."""
        words = list(dict.fromkeys(m.lower() for w in words for m in _WORD.findall(w)))
        words = words[:MAX_SEARCH_WORDS]
        if not words:
            return []
        with self._read() as c:
            segments = lineage(c, session_id)
            if len(segments) == 1:
                sql, params = self._search_query(
                    words, session_id, (first, last), limit, offset, snippet_chars
                )
                c.execute(sql, params)
                return [SearchHit(codec.row_of(r), r[11] or "") for r in c.fetchall()]
            # A fork: each segment of its lineage searched (its best limit + offset), ranked
            # together (the ranks of one index compare), the hits named as the fork's rows.
            found: list[tuple[float, int, SearchHit]] = []
            sign = 1.0 if self.engine is Engine.SQLITE else -1.0  # bm25: lower is better
            for seg in segments:
                lo, hi = max(first, seg.lo), min(last, seg.hi)
                if lo > hi:
                    continue
                sql, params = self._search_query(
                    words, seg.session, (lo, hi), limit + offset, 0, snippet_chars
                )
                c.execute(sql, params)
                for r in c.fetchall():
                    row = codec.row_of(r)._replace(session=session_id)
                    found.append((sign * float(r[12]), row.seq, SearchHit(row, r[11] or "")))
        found.sort(key=lambda f: (f[0], f[1]))
        return [f[2] for f in found[offset : offset + limit]]

    def _search_query(
        self,
        words: Sequence[str],
        session_id: str,
        seqs: tuple[int, int],
        limit: int,
        offset: int,
        snippet_chars: int,
    ) -> tuple[str, list[Any]]:
        """The ranked search over one session's rows with ``seqs[0] <= seq <= seqs[1]`` (the
        statement and its parameters): columns are :data:`~tether.ledger.codec.ROW_COLUMNS` of
        ``rows``, a snippet and the rank, best ranked first."""
        if self.engine is Engine.SQLITE:
            return _sqlite_query(words, session_id, seqs, limit, offset, snippet_chars)
        return _postgres_query(words, session_id, seqs, limit, offset, snippet_chars)


def _sqlite_query(
    words: Sequence[str],
    session_id: str,
    seqs: tuple[int, int],
    limit: int,
    offset: int,
    snippet_chars: int,
) -> tuple[str, list[Any]]:
    # Each word a quoted FTS5 string (words hold only \w characters, so no quote to
    # escape), any of them matching; rank is FTS5's bm25.
    match = " OR ".join(f'"{w}"' for w in words)
    tokens = max(8, min(64, snippet_chars // 6))
    # The session's rows are the rowids FTS_KEY_SPAN * num + seq of rows_fts: FTS5 reads
    # that range of each word's doclist, never other sessions' matches (bm25's document
    # frequencies still count the whole index, as they did, so the ranking is unchanged).
    first, last = max(seqs[0], 0), min(seqs[1], FTS_KEY_SPAN - 1)
    num = "(SELECT num FROM sessions WHERE id = ?)"
    sql = (
        f"SELECT {_R_COLS}, snippet(rows_fts, 0, '', '', '…', ?), rank "
        "FROM rows_fts JOIN rows r ON r.fts_key = rows_fts.rowid "
        f"WHERE rows_fts MATCH ? AND rows_fts.rowid >= {num} * {FTS_KEY_SPAN} + ? "
        f"AND rows_fts.rowid <= {num} * {FTS_KEY_SPAN} + ? AND r.session = ? "
        "ORDER BY rank, r.seq LIMIT ? OFFSET ?"
    )
    params = [tokens, match, session_id, first, session_id, last, session_id, limit, offset]
    return sql, params


def _postgres_query(
    words: Sequence[str],
    session_id: str,
    seqs: tuple[int, int],
    limit: int,
    offset: int,
    snippet_chars: int,
) -> tuple[str, list[Any]]:
    # Any of the words (each a plainto_tsquery, so no query syntax reaches the parser), AND
    # the session's lexeme: the match is answered by the GIN index on FTS_SESSION_DOCUMENT
    # alone, and yields only this session's matches. No condition there names the session
    # or the seq (the (session, seq) index serves a seq range too, scanned whole), so the
    # planner cannot walk rows and parse every one instead, as it would without statistics.
    # Words that parse to no lexeme make an empty query, which matches nothing (ANDed with
    # an empty query the session's lexeme would match every row: numnode keeps it empty).
    # The matches are materialized, then checked against the session itself (md5 may
    # collide) and the seq range. Ranking re-parses a row's text, so at most
    # RANK_CANDIDATES matches of the session (the newest) are ranked; ts_headline runs for
    # the hits alone.
    query = " || ".join("plainto_tsquery('simple', ?)" for _ in words)
    words_per = max(8, min(60, snippet_chars // 7))
    sql = (
        "WITH matched AS MATERIALIZED (SELECT id, seq, session FROM rows "
        f"WHERE {FTS_SESSION_DOCUMENT} @@ (({query}) && {FTS_SESSION_QUERY}) "
        f"AND numnode({query}) > 0), "
        "candidates AS (SELECT id, seq FROM matched WHERE session = ? AND seq >= ? "
        "AND seq <= ? ORDER BY seq DESC LIMIT ?), "
        f"hits AS (SELECT c.id, c.seq, ts_rank({FTS_DOCUMENT}, {query}) AS rank "
        "FROM candidates c JOIN rows r ON r.id = c.id "
        "ORDER BY rank DESC, c.seq LIMIT ? OFFSET ?) "
        f"SELECT {_R_COLS}, ts_headline('simple', left(r.text, {FTS_MAX_CHARS}), "
        f"{query}, ?), hits.rank FROM hits JOIN rows r ON r.id = hits.id "
        "ORDER BY hits.rank DESC, r.seq"
    )
    options = f'MaxWords={words_per}, MinWords={words_per // 2}, StartSel="", StopSel=""'
    params = [
        *words,
        session_id,
        *words,
        session_id,
        *seqs,
        RANK_CANDIDATES,
        *words,
        limit,
        offset,
        *words,
        options,
    ]
    return sql, params
