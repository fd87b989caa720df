"""The service under hostile input (issue 32), each through the real HTTP server: `tether serve`
(uvicorn) on 127.0.0.1, no worker (requests stay queued), SQLite."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service_support import Served, auth, serve, write_config
from support.tier import examples
from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger

MSG = {"role": "user", "content": [{"type": "text", "text": "hello"}], "timestamp": 1}


def seed(ledger: Ledger) -> dict[str, str]:
    """ "open": a finished run ana asked for; "secret": its opening row carries repo:acme/api
    (ana and carl are granted repo:acme/*, bob nothing); returns their run ids."""
    runs = {}
    for session, sources in (("open", ()), ("secret", ("repo:acme/api",))):
        ledger.ensure_session(session)
        run = ledger.create_run(session, "rev", extra={"request": {"actor": "user:ana"}})
        fence = ledger.claim_run(run.id)
        ledger.append(
            fence,
            [NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=MSG, sources=sources)],
            request=True,
        )
        answer = {**MSG, "role": "assistant", "content": [{"type": "text", "text": "hi"}]}
        ledger.append(fence, [NewRow.message("agent:rev", answer, sources=sources)])
        ledger.end_run(fence, RunStatus.FINISHED, extra={"answer": "hi"})
        runs[session] = run.id
    return runs


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, dict[str, str]]]:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        runs = seed(ledger)
    with serve(tmp_path, config, workers=0) as s:
        yield s, runs


def no_server_path(s: Served, response: httpx.Response) -> None:
    assert str(s.tmp) not in response.text, response.text
    assert "tether.toml" not in response.text, response.text


# -- 1. bodies bounded, token first, unknown fields refused ----------------------------------------


def _stream_body(url: str, head: str, total: int, *, chunked: bool = True) -> tuple[bytes, int]:
    """Send ``head`` then up to ``total`` bytes of body (chunked, or plain after a
    Content-Length) over a raw socket, reading the answer meanwhile; returns (the answer, the
    body bytes the socket took)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    answer = bytearray()

    def read() -> None:
        while True:
            try:
                got = sock.recv(65536)
            except OSError:
                return
            if not got:
                return
            answer.extend(got)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = 0
    chunk = b"x" * (1 << 20)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk
    try:
        sock.sendall(head.encode())
        while sent < total:
            sock.sendall(framed)
            sent += len(chunk)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed: it reads no further
    reader.join(30)
    sock.close()
    return bytes(answer), sent


def test_oversized_and_unauthenticated_bodies_are_refused_unread_and_memory_stays_flat(
    served: tuple[Served, dict[str, str]],
) -> None:
    s, _ = served
    proc = psutil.Process(s.proc.pid)
    for _ in range(20):  # warm the process up (routes, templates, the ledger's connections)
        s.post("open", "warm", agent="nobody")
        s.client.get("/v1/sessions", headers=auth())
    before = proc.memory_info().rss
    peak = before
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    path = "/v1/sessions/open/requests"
    heads = {
        "no token, chunked": (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ),
        "bad token, chunked": (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ),
        "valid token, chunked": (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ana-token\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ),
    }
    started = time.monotonic()
    answers = {}
    for name, head in heads.items():
        answers[name], _ = _stream_body(s.url, head, 300 << 20)
    elapsed = time.monotonic() - started
    stop.set()
    sampler.join()
    after = proc.memory_info().rss
    assert answers["no token, chunked"].startswith(b"HTTP/1.1 401"), answers
    assert answers["bad token, chunked"].startswith(b"HTTP/1.1 401"), answers
    assert answers["valid token, chunked"].startswith(b"HTTP/1.1 413"), answers
    assert b"max_body_bytes" in answers["valid token, chunked"]
    assert b"connection: close" in answers["valid token, chunked"].lower()
    print(
        f"rss before {before >> 20} MiB, peak {peak >> 20} MiB, after {after >> 20} MiB; "
        f"3 x 300 MiB bodies in {elapsed:.1f} s"
    )
    assert after - before < 20 << 20, (before, peak, after)
    assert peak - before < 20 << 20, (before, peak, after)
    # A Content-Length over the limit: 413 before a byte is read.
    length, _ = _stream_body(
        s.url,
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ana-token\r\n"
        f"Content-Type: application/json\r\nContent-Length: {300 << 20}\r\n\r\n",
        300 << 20,
        chunked=False,
    )
    assert length.startswith(b"HTTP/1.1 413"), length
    assert b"max_body_bytes" in length
    assert proc.memory_info().rss - before < 20 << 20
    assert s.get("/v1/sessions/open/rows").json()["last_seq"] == 2, "nothing was written"


def test_the_body_limit_and_unknown_fields(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", extra="max_body_bytes = 4096")
    with serve(tmp_path, config, workers=0) as s:
        big = s.post("s1", "x" * 5000)
        assert big.status_code == 413, big.text
        assert "4096 bytes" in big.json()["detail"]

        def chunks() -> Iterator[bytes]:
            yield b'{"agent":"rev","text":"'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}'

        chunked = s.client.post(
            "/v1/sessions/s1/requests",
            content=chunks(),
            headers={**auth(), "Content-Type": "application/json"},
        )
        assert chunked.status_code == 413, chunked.text
        unknown = s.post("s1", "hello", colour="blue")
        assert unknown.status_code == 422, unknown.text
        [error] = unknown.json()["detail"]
        assert error["loc"] == ["body", "colour"]
        assert error["type"] == "extra_forbidden"
        note = s.client.post(
            "/v1/sessions/s1/notes", json={"agent": "rev", "text": "n", "by": "x"}, headers=auth()
        )
        assert note.status_code == 422
        assert s.get("/v1/sessions").json() == {"sessions": []}, "nothing was written"


def test_the_default_limit_takes_the_largest_admissible_request(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with serve(tmp_path, config, workers=0) as s:
        # A quarter of the default 240,000-byte budget, every byte JSON-escaped to 6.
        largest = "\x01" * 60_000
        body = json.dumps({"agent": "rev", "text": largest})
        assert len(body) > 360_000
        ok = s.client.post(
            "/v1/sessions/s1/requests",
            content=body,
            headers={**auth(), "Content-Type": "application/json"},
        )
        assert ok.status_code == 202, ok.text[:300]
        over = s.post("s1", "x" * 60_001)
        assert over.status_code == 409, "over request_max_bytes: refused by admission"
        huge = s.post("s1", "hi", padding="x" * 10_000_000)
        assert huge.status_code == 413, "a 10 MB unknown field is not read"


# -- 2. attribution --------------------------------------------------------------------------------


def test_a_note_posted_through_the_api_carries_its_actor_and_the_view_names_it(
    served: tuple[Served, dict[str, str]],
) -> None:
    s, runs = served
    posted = s.client.post(
        "/v1/sessions/open/notes",
        json={"agent": "rev", "text": "Ship it on Friday."},
        headers=auth("bob-token"),
    )
    assert posted.status_code == 201, posted.text
    assert posted.json()["actor"] == "user:bob"
    assert posted.json()["run"] is None
    # The agent's own note, written in its run (as the note tool does).
    with open_ledger(f"sqlite://{s.tmp}/ledger.db") as ledger:
        ledger.add_note(
            "open", "rev", "The retry limit stays at 3.", actor="user:ana", run=runs["open"]
        )
        stored = {n.text: n for n in ledger.all_notes("open")}
    assert stored["Ship it on Friday."].actor == "user:bob"
    assert stored["Ship it on Friday."].run is None
    view = s.get("/v1/sessions/open/context", agent="rev").json()
    [notes] = [m for m in view["messages"] if m.get("customType") == "tether.notes"]
    text = notes["content"]
    text = text if isinstance(text, str) else text[0]["text"]
    assert f"Note by agent rev (run {runs['open']}, working for user:ana)" in text, (
        "the agent's own note"
    )
    assert "Note by user:bob, added outside any run (not agent rev's own)" in text
    assert "Note by agent rev (run unknown" not in text
    too_long = s.client.post(
        "/v1/sessions/open/notes", json={"agent": "rev", "text": "x" * 2001}, headers=auth()
    )
    assert too_long.status_code == 422
    assert "2000-byte limit" in too_long.json()["detail"]


def test_a_queued_request_carries_the_tokens_actor(
    served: tuple[Served, dict[str, str]],
) -> None:
    s, _ = served
    run = s.post("open", "from carl", token="carl-token", actor="user:ana")
    assert run.status_code == 422, "the actor is the token's, never a body field"
    run = s.post("open", "from carl", token="carl-token").json()["run"]
    assert s.get(f"/v1/runs/{run}", "carl-token").json()["actor"] == "user:carl"
    with open_ledger(f"sqlite://{s.tmp}/ledger.db") as ledger:
        assert ledger.get_run(run).extra["request"]["actor"] == "user:carl"


# -- 3. request_id scoped to (session, actor) ------------------------------------------------------


def test_a_request_id_is_scoped_to_session_and_actor_and_a_changed_payload_is_409(
    served: tuple[Served, dict[str, str]],
) -> None:
    s, _ = served
    first = s.post("open", "do it", request_id="k1")
    assert first.status_code == 202, first.text
    again = s.post("open", "do it", request_id="k1")
    assert again.json() == first.json()
    changed = s.post("open", "do something else", request_id="k1")
    assert changed.status_code == 409, changed.text
    detail = changed.json()["detail"]
    assert detail["reason"] == "request_id_conflict"
    assert "another text" in detail["detail"]
    assert first.json()["run"] in detail["detail"]
    carl = s.post("open", "do it", token="carl-token", request_id="k1")
    assert carl.status_code == 202
    assert carl.json()["run"] != first.json()["run"], "another actor's key is its own"
    elsewhere = s.post("other", "do it", request_id="k1")
    assert elsewhere.json()["run"] != first.json()["run"]
    with open_ledger(f"sqlite://{s.tmp}/ledger.db") as ledger:
        queued = ledger.queued_runs("open")
        assert [r.extra["request"]["actor"] for r in queued] == ["user:ana", "user:carl"]
        assert queued[0].extra["request"]["text"] == "do it"


# -- 4. admission on GET /v1/runs/{run} ------------------------------------------------------------


def test_a_run_of_a_session_the_caller_may_not_see_is_403(
    served: tuple[Served, dict[str, str]],
) -> None:
    s, runs = served
    denied = s.get(f"/v1/runs/{runs['secret']}", "bob-token")
    assert denied.status_code == 403, denied.text
    assert "user:ana" not in denied.text
    assert s.get("/v1/sessions/secret/rows", "bob-token").status_code == 403
    assert s.get(f"/v1/runs/{runs['secret']}", "ana-token").json()["status"] == "finished"
    assert s.get(f"/v1/runs/{runs['open']}", "bob-token").status_code == 200


# -- 5. bad ids and text: 4xx with a message -------------------------------------------------------

BAD_SESSIONS = {"NUL": "a\x00b", "newline": "a\nb", "5,000 characters": "s" * 5000}


@pytest.mark.parametrize("name", sorted(BAD_SESSIONS))
def test_a_bad_session_id_is_422_with_a_message_everywhere(
    served: tuple[Served, dict[str, str]], name: str
) -> None:
    s, _ = served
    q = quote(BAD_SESSIONS[name], safe="")
    answers = [
        s.client.post(
            f"/v1/sessions/{q}/requests", json={"agent": "rev", "text": "hi"}, headers=auth()
        ),
        s.client.post(
            f"/v1/sessions/{q}/notes", json={"agent": "rev", "text": "hi"}, headers=auth()
        ),
        s.client.get(f"/v1/sessions/{q}/rows", headers=auth()),
        s.client.get(f"/v1/sessions/{q}/context?agent=rev", headers=auth()),
        s.client.get(f"/sessions/{q}.json", headers=auth()),
    ]
    for got in answers:
        assert got.status_code == 422, (got.request.url, got.status_code, got.text[:300])
        assert "session id" in json.dumps(got.json()["detail"]), got.text[:300]
        no_server_path(s, got)
    page = s.client.get(f"/sessions/{q}", headers=auth())
    assert page.status_code == 422
    assert page.headers["content-type"].startswith("text/html")
    assert "session id" in page.text
    run = s.client.get(f"/v1/runs/{q}", headers=auth())
    assert run.status_code == 422
    assert "run id" in json.dumps(run.json()["detail"])
    sessions = {x["session"] for x in s.get("/v1/sessions").json()["sessions"]}
    assert sessions == {"open", "secret"}, "nothing was written"


def test_lone_surrogates_in_a_json_body_are_422(served: tuple[Served, dict[str, str]]) -> None:
    s, _ = served
    for body in (
        b'{"agent":"rev","text":"\\ud800"}',
        b'{"agent":"rev","text":"ok","request_id":"k\\udfff"}',
        b'{"agent":"r\\ud800","text":"ok"}',
        b'{"agent":"rev","text":"ok","\\ud800":1}',
    ):
        got = s.client.post(
            "/v1/sessions/open/requests",
            content=body,
            headers={**auth(), "Content-Type": "application/json"},
        )
        assert got.status_code == 422, (body, got.status_code, got.text)
        assert got.json()["detail"], got.text
    note = s.client.post(
        "/v1/sessions/open/notes",
        content=b'{"agent":"rev","text":"a\\ud800b"}',
        headers={**auth(), "Content-Type": "application/json"},
    )
    assert note.status_code == 422
    assert note.json()["detail"][0]["loc"] == ["body", "text"]
    assert "unicode" in note.json()["detail"][0]["msg"]
    with open_ledger(f"sqlite://{s.tmp}/ledger.db") as ledger:
        assert ledger.queued_runs("open") == []
        assert ledger.all_notes("open") == []


# -- 6. pages show errors as pages, no response names a server path --------------------------------


def test_pages_render_errors_as_pages_naming_no_server_path(
    served: tuple[Served, dict[str, str]],
) -> None:
    s, _ = served
    unknown = s.client.get("/sessions/open/next?agent=unknown", headers=auth())
    assert unknown.status_code == 422
    assert unknown.headers["content-type"].startswith("text/html")
    assert "unknown agent &#39;unknown&#39; (configured here: rev)" in unknown.text
    assert "<h1>422 Unprocessable" in unknown.text
    no_server_path(s, unknown)
    missing = s.client.get("/sessions/nope", headers=auth())
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("text/html")
    assert "no session &#39;nope&#39;" in missing.text
    assert "first page" in missing.text, "what to do"
    denied = s.client.get("/sessions/secret", headers=auth("bob-token"))
    assert denied.status_code == 403
    assert "grant" in denied.text
    bad_query = s.client.get("/sessions/open?after=-1", headers=auth())
    assert bad_query.status_code == 422
    assert bad_query.headers["content-type"].startswith("text/html")
    assert "after" in bad_query.text
    # JSON twins and the API keep answering JSON, and name no path either.
    twin = s.client.get("/sessions/open/next.json?agent=unknown", headers=auth())
    assert twin.status_code == 422
    assert "configured here: rev" in twin.json()["detail"]
    api = s.post("open", "hi", agent="unknown")
    assert api.status_code == 422
    for got in (twin, api, s.client.get("/healthz")):
        no_server_path(s, got)
    # Not logged in: still the login redirect, not an error page.
    login = s.client.get("/sessions/open", follow_redirects=False)
    assert login.status_code == 303


# -- the property: arbitrary ids and bodies never give a 5xx ---------------------------------------

ANY_CHAR = st.characters(codec=None, exclude_categories=())
ANY_TEXT = st.text(ANY_CHAR, max_size=40) | st.text(ANY_CHAR, min_size=1000, max_size=6000)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=8,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "agent": st.sampled_from(["rev"]) | ANY_TEXT | JSON_VALUE,
        "text": ANY_TEXT | JSON_VALUE,
        "request_id": ANY_TEXT | JSON_VALUE,
        "deliver": st.sampled_from(["queue", "steer", "follow_up"]) | ANY_TEXT,
    },
)
BODY = FIELDS | JSON_VALUE
ROUTES = [
    ("POST", "/v1/sessions/{id}/requests"),
    ("POST", "/v1/sessions/{id}/notes"),
    ("GET", "/v1/sessions/{id}/rows"),
    ("GET", "/v1/sessions/{id}/context?agent={id}"),
    ("GET", "/v1/runs/{id}"),
    ("GET", "/sessions/{id}"),
    ("GET", "/sessions/{id}.json"),
    ("GET", "/sessions/{id}/next?agent={id}"),
]


def test_arbitrary_ids_and_json_bodies_never_give_a_5xx(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        seed(ledger)
    seen: dict[int, int] = {}
    with serve(tmp_path, config, workers=0) as s:

        @settings(
            max_examples=examples(300, unit=50),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(
            route=st.sampled_from(ROUTES),
            ident=ANY_TEXT | st.sampled_from(["open", "secret"]),
            body=BODY,
            raw=st.none() | st.binary(max_size=64),
            token=st.sampled_from(["ana-token", "bob-token"]),
        )
        def check(
            route: tuple[str, str], ident: str, body: Any, raw: bytes | None, token: str
        ) -> None:
            method, template = route
            # Percent-encoded as UTF-8; a lone surrogate cannot be, so it goes as its escape.
            q = quote(ident.encode("utf-8", "surrogatepass"), safe="")
            url = template.format(id=q)
            content = raw if raw is not None else json.dumps(body).encode()
            got = s.client.request(
                method,
                url,
                content=content if method == "POST" else None,
                headers={**auth(token), "Content-Type": "application/json"},
            )
            seen[got.status_code] = seen.get(got.status_code, 0) + 1
            assert got.status_code < 500, (method, url[:200], content[:200], got.text[:500])
            assert str(tmp_path) not in got.text

        check()
    print("statuses seen:", dict(sorted(seen.items())))
    assert len(seen) > 3, seen
