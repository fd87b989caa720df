"""The provider's path out of the sandbox, piece by piece (docs/security.md): the forwarder
(``tether/sandbox/outside.py``, run as a sandboxed run runs it) over its Unix socket against an
upstream this test plays, and pi's relay (``extension/js/relay.js``) in the real Node, which
turns connections to the placeholder host into connections to that socket.

The forwarder passes on only the requests of the provider's api, with the key in that api's
header alone, and never lets the key back to pi in an answer: each rule is driven here
directly, then through the real pi, whose own requests for every api must pass and whose tools'
must not."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from provider import Reply, ScriptedProvider, ToolCall
from support.config import write_config
from support.net import accept_in_thread
from tether.config import AgentConfig, ProviderConfig, parse_config
from tether.ledger import open_ledger
from tether.pi.agentdir import pi_models, provider_keys
from tether.pi.install import extension_file, find_pi
from tether.pi.keys import key_channel
from tether.sandbox import outside
from tether.sandbox.bwrap import OUTSIDE_SCRIPT, PROVIDER_ORIGIN, SandboxUnavailable

KEY = "sk-forwarder-test-key"
PLACEHOLDER = "tether-no-key"


class Upstream:
    """A provider on 127.0.0.1 that keeps connections alive (HTTP/1.1, lengths or chunks) and
    records each request's head and the connection it came on."""

    def __init__(
        self, answer: Callable[[socket.socket, bytes], bool], tls: ssl.SSLContext | None = None
    ) -> None:
        self.answer = answer  # writes the answer; False: close the connection after it
        self.tls = tls
        self.heads: list[tuple[int, bytes, bytes]] = []  # (connection number, head, body)
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        scheme = "https" if tls is not None else "http"
        self.origin = f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}"
        accept_in_thread(self.listener, self._accepted)

    def _accepted(self, conn: socket.socket) -> None:
        self.connections += 1
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                conn.close()
                return
        threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, data = data.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(data) < length:
                    data += conn.recv(65536)
                body, data = data[:length], data[length:]
                self.heads.append((number, head, body))
                if not self.answer(conn, body):
                    return

    def close(self) -> None:
        self.listener.close()


def length_answer(conn: socket.socket, body: bytes) -> bool:
    reply = b"echo:" + body
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nKeep-Alive: timeout=5\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply)
    )
    return True


@pytest.fixture
def forwarder(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Start the forwarder for an upstream origin (with the key on its pipe, as the keeper
    hands it on); the socket's path."""
    started: list[subprocess.Popen[bytes]] = []

    def start(
        origin: str, api: str | None = "openai-completions", base: str = "/v1", **extra_env: str
    ) -> Path:
        path = tmp_path / f"provider-{len(started)}.sock"
        with key_channel({"local": KEY}) as channel:  # the harness's own channel
            read = os.dup(channel.pass_fds[0])
        env = {**os.environ, "TETHER_KEY_FD": str(read), "TETHER_KEY_PLACEHOLDER": PLACEHOLDER}
        env.update(extra_env)
        argv = [sys.executable, "-I", "-S", str(OUTSIDE_SCRIPT), "--socket", str(path)]
        if api is not None:
            argv += ["--api", api, "--base-path", base]
        proc = subprocess.Popen(
            [*argv, "--upstream", origin, "--", "/bin/sleep", "3600"],
            env=env,
            pass_fds=(read,),
            start_new_session=True,
        )
        os.close(read)
        started.append(proc)
        deadline = time.monotonic() + 10
        while not path.exists():
            assert time.monotonic() < deadline, "the forwarder never made its socket"
            time.sleep(0.01)
        return path

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)  # it and the sleep it started
        proc.wait()


def exchange(path: Path, request: bytes, *, half_close: bool = False) -> bytes:
    """One request over a new connection to the forwarder, as pi's HTTP client sends it (it
    keeps its side open, unless ``half_close``); the whole answer, up to the forwarder's close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def post(body: bytes, *, path: str = "/v1/chat/completions") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: tether-provider.invalid\r\nConnection: keep-alive\r\n"
        f"Authorization: Bearer {PLACEHOLDER}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@given(st.dictionaries(st.text(min_size=1), st.text(), min_size=1, max_size=3))
@example({'"key": "a': "b", "p": "c"})
@example({"p": '", "key": "not this'})
@example({"p": '\\"\u00e9\U0001f600\x00\n'})
def test_the_forwarder_reads_the_first_grants_key_whatever_the_texts(keys: dict[str, str]) -> None:
    # The forwarder reads the key channel without the json module (sandbox/outside.py): what
    # it reads is what the harness wrote, for any provider names and keys.
    with key_channel(keys) as channel:
        fd = os.dup(channel.pass_fds[0])
    assert outside._read_key(fd) == next(iter(keys.values())).encode()


def test_an_empty_channel_or_none_gives_no_key() -> None:
    read, write = os.pipe()
    os.close(write)
    assert outside._read_key(read) == b""
    assert outside._read_key(None) == b""


def test_requests_reach_the_provider_with_the_key_on_one_kept_connection(
    forwarder: Callable[..., Path],
) -> None:
    upstream = Upstream(length_answer)
    try:
        sock = forwarder(upstream.origin)
        bodies = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * (i * 40_000)) for i in range(3)]
        answers = [exchange(sock, post(body)) for body in bodies]
    finally:
        upstream.close()
    for body, answer in zip(bodies, answers, strict=True):
        head, _, got = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        lines = head.lower().split(b"\r\n")
        # pi is told the connection ends with the answer; the upstream's keep-alive is its own.
        assert b"connection: close" in lines
        assert not any(line.startswith(b"keep-alive") for line in lines)
        assert got == b"echo:" + body
    # Three requests, one TCP connection upstream: no handshake per request.
    assert upstream.connections == 1
    assert [number for number, _, _ in upstream.heads] == [1, 1, 1]
    for _, head, _ in upstream.heads:
        text = head.decode()
        assert text.startswith("POST /v1/chat/completions HTTP/1.1")
        assert f"Authorization: Bearer {KEY}" in text
        assert "Accept-Encoding: identity" in text
        assert f"Host: {upstream.origin.split('//')[1]}" in text
        assert PLACEHOLDER not in text
        assert "tether-provider.invalid" not in text


def test_an_https_provider_is_reached_over_tls_on_one_kept_connection(
    forwarder: Callable[..., Path], tmp_path: Path
) -> None:
    """The forwarder verifies the provider's certificate (the system's trust store, here one
    that holds only this test's certificate) and keeps the TLS connection for the next
    request."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    upstream = Upstream(length_answer, tls=context)
    try:
        sock = forwarder(upstream.origin, SSL_CERT_FILE=str(cert))
        answers = [exchange(sock, post(b"over tls %d" % i)) for i in range(2)]
        untrusted = forwarder(upstream.origin, SSL_CERT_FILE=os.devnull)
        refused = exchange(untrusted, post(b"{}"))
    finally:
        upstream.close()
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [
        b"echo:over tls 0",
        b"echo:over tls 1",
    ]
    assert upstream.connections == 2  # one kept for both requests, one the refused handshake
    assert [number for number, _, _ in upstream.heads] == [1, 1]
    assert refused.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert b"CERTIFICATE_VERIFY_FAILED" in refused


def test_a_kept_connection_the_provider_closed_is_replaced_without_losing_the_request(
    forwarder: Callable[..., Path],
) -> None:
    # The provider answers, then drops the connection (an idle timeout): the forwarder's kept
    # connection is dead by the next request.
    def answer_then_drop(conn: socket.socket, body: bytes) -> bool:
        length_answer(conn, body)
        return False

    upstream = Upstream(answer_then_drop)
    try:
        sock = forwarder(upstream.origin)
        first = exchange(sock, post(b"one"))
        time.sleep(0.2)  # the drop has reached the forwarder's side
        second = exchange(sock, post(b"two"))
    finally:
        upstream.close()
    assert first.endswith(b"echo:one")
    assert second.endswith(b"echo:two")
    assert [body for _, _, body in upstream.heads] == [b"one", b"two"]
    assert upstream.connections == 2


def test_a_streamed_answer_passes_chunk_by_chunk_unbuffered(
    forwarder: Callable[..., Path],
) -> None:
    # The upstream sends its second chunk only once the first has come out of the forwarder.
    first_seen = threading.Event()

    def streamed(conn: socket.socket, body: bytes) -> bool:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        conn.sendall(b"d\r\ndata: first\n\n\r\n")
        assert first_seen.wait(10), "the first chunk never came out of the forwarder"
        conn.sendall(b"e\r\ndata: second\n\n\r\n0\r\n\r\n")
        return True

    upstream = Upstream(streamed)
    try:
        path = forwarder(upstream.origin)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(path))
            sock.sendall(post(b"{}"))
            data = b""
            while b"data: first" not in data:
                chunk = sock.recv(65536)
                assert chunk, f"the stream ended before its first event: {data!r}"
                data += chunk
            first_seen.set()
            while chunk := sock.recv(65536):
                data += chunk
    finally:
        upstream.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    # Byte for byte, chunks included; only the connection is the forwarder's.
    assert b"connection: close" in lines
    assert b"transfer-encoding: chunked" in lines
    assert body == b"d\r\ndata: first\n\n\r\ne\r\ndata: second\n\n\r\n0\r\n\r\n"


def test_an_answer_the_provider_cuts_short_reaches_pi_cut_short(
    forwarder: Callable[..., Path],
) -> None:
    """The provider dies mid-stream: pi's client must see a truncated answer, not a complete
    one (a truncated summary must never look whole)."""
    import http.client

    def cut(conn: socket.socket, body: bytes) -> bool:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nd\r\ndata: first\n\n\r\n"
        )
        return False  # and the connection closes: no last chunk

    upstream = Upstream(cut)
    try:
        data = exchange(forwarder(upstream.origin), post(b"{}"))
    finally:
        upstream.close()

    class Replay:  # what pi's end of the connection got, read as an HTTP client reads it
        def makefile(self, *args: object, **kwargs: object) -> Any:
            return io.BytesIO(data)

    answer = http.client.HTTPResponse(Replay())  # type: ignore[arg-type]
    answer.begin()
    with pytest.raises(http.client.IncompleteRead):
        answer.read()


def test_an_unreachable_provider_and_a_bad_request_are_answered_by_the_forwarder(
    forwarder: Callable[..., Path],
) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    sock = forwarder(f"http://127.0.0.1:{port}")
    answer = exchange(sock, post(b"{}"))
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert f"cannot reach http://127.0.0.1:{port}".encode() in answer
    chunked = b"POST /v1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert exchange(sock, chunked, half_close=True).startswith(b"HTTP/1.1 411 Length Required")


RELAY_PROBE = r"""
import http from "node:http";
const results = {};
const answer = await fetch("http://tether-provider.invalid/v1/fetch", {
    method: "POST", body: "via-fetch",
});
results.fetch = [answer.status, await answer.text()];
results.http = await new Promise((resolve, reject) => {
    const where = { host: "tether-provider.invalid", port: 80, path: "/v1/http", method: "POST" };
    const req = http.request(where, (res) => {
        let text = "";
        res.on("data", (d) => (text += d));
        res.on("end", () => resolve([res.statusCode, text]));
    });
    req.on("error", reject);
    req.end("via-http");
});
const elsewhere = `http://127.0.0.1:${process.argv[2]}/elsewhere`;
const other = await fetch(elsewhere, { method: "POST", body: "tcp" });
results.other = [other.status, await other.text()];
results.env = process.env.TETHER_PROVIDER_SOCKET ?? null;
console.log(JSON.stringify(results));
"""


def test_pi_s_relay_sends_the_placeholder_host_to_the_socket_and_nothing_else(
    tmp_path: Path,
) -> None:
    """In the real Node pi runs on: fetch (undici) and node:http connections to the placeholder
    host reach the forwarder's socket; a connection to any other address is left alone; the
    socket's path is gone from the environment pi's tools inherit."""
    assert PROVIDER_ORIGIN == "http://tether-provider.invalid"
    seen: list[bytes] = []

    def serve(listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                seen.append(data.split(b"\r\n", 1)[0])
                kind = b"unix" if listener.family == socket.AF_UNIX else b"tcp"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(kind), kind)
                )

    path = tmp_path / "provider.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(path))
    unix.listen(8)
    tcp = socket.create_server(("127.0.0.1", 0))
    for listener in (unix, tcp):
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
    script = tmp_path / "probe.mjs"
    script.write_text(RELAY_PROBE)
    relay = extension_file("relay").as_uri()
    try:
        done = subprocess.run(
            [find_pi().node, "--import", relay, str(script), str(tcp.getsockname()[1])],
            env={**os.environ, "TETHER_PROVIDER_SOCKET": str(path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        unix.close()
        tcp.close()
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results == {
        "fetch": [200, "unix"],
        "http": [200, "unix"],
        "other": [200, "tcp"],
        "env": None,
    }
    assert sorted(seen) == [
        b"POST /elsewhere HTTP/1.1",
        b"POST /v1/fetch HTTP/1.1",
        b"POST /v1/http HTTP/1.1",
    ]


# -- Only the provider's api, the key in its header alone, never back to pi -------------------

MASK = "*" * len(KEY)
"""What stands for the key in an answer (as long as the key: lengths and chunk sizes hold)."""

PI_REQUESTS = {
    # api: (the base URL's path, pi's request target, pi's key header as it sends it, as the
    # provider gets it). Recorded from the real pi (1.6: pi-ai's clients) against a recording
    # server; test_pi_s_own_requests_for_each_api_pass_the_forwarder checks them again.
    "openai-completions": (
        "/v1",
        "/v1/chat/completions",
        "authorization: Bearer {}",
        "Authorization: Bearer {}",
    ),
    "openai-responses": (
        "/v1",
        "/v1/responses",
        "authorization: Bearer {}",
        "Authorization: Bearer {}",
    ),
    "anthropic-messages": ("", "/v1/messages?beta=true", "x-api-key: {}", "x-api-key: {}"),
    "google-generative-ai": (
        "/v1beta",
        "/v1beta/models/gemini-test-1.5:streamGenerateContent?alt=sse",
        "x-goog-api-key: {}",
        "x-goog-api-key: {}",
    ),
    "mistral-conversations": (
        "",
        "/v1/chat/completions",
        "authorization: Bearer {}",
        "Authorization: Bearer {}",
    ),
}
PI_MODEL = "gemini-test-1.5"


def ask(method: str, target: str, *headers: str, body: bytes = b"") -> bytes:
    """A request as pi's client (or a tool playing it) sends it to the forwarder."""
    lines = [f"{method} {target} HTTP/1.1", "Host: tether-provider.invalid", *headers]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def echoing() -> Upstream:
    """A provider that names, in its 404, the request it does not know, as OpenAI's does
    (``Invalid URL (GET /v1/…)``): whatever the target carries comes back in the answer."""

    def answer(conn: socket.socket, body: bytes) -> bool:
        line = upstream.heads[-1][1].split(b"\r\n", 1)[0].rsplit(b" ", 1)[0]
        reply = b'{"error": {"message": "Invalid URL (%s)"}}' % line
        conn.sendall(
            b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply)
        )
        return True

    upstream = Upstream(answer)
    return upstream


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_every_api_the_forwarder_passes_on_is_tested() -> None:
    assert set(PI_REQUESTS) == set(outside.FORWARDED_APIS)


@pytest.mark.parametrize("api", sorted(PI_REQUESTS))
def test_each_api_s_own_request_passes_with_the_key_in_its_header_alone(
    forwarder: Callable[..., Path], api: str
) -> None:
    base, target, sent, got = PI_REQUESTS[api]
    upstream = Upstream(length_answer)
    try:
        sock = forwarder(upstream.origin, api=api, base=base)
        answer = exchange(sock, ask("POST", target, sent.format(PLACEHOLDER), body=b"{}"))
        # Every other api's request, and this one's outside the base URL's path: refused.
        others = {t for b, t, _, _ in PI_REQUESTS.values() if t != target}
        others.add(target.removeprefix(base) if base else "/v2" + target)
        refused = [
            exchange(sock, ask("POST", other, sent.format(PLACEHOLDER), body=b"{}"))
            for other in sorted(others)
        ]
    finally:
        upstream.close()
    assert answer.endswith(b"echo:{}"), answer
    assert [status(a) for a in refused] == [403] * len(refused), refused
    ((_, head, _),) = upstream.heads  # the provider saw that one request, and nothing else
    text = head.decode()
    lines = text.split("\r\n")
    assert lines[0] == f"POST {target} HTTP/1.1"
    # The key in the api's header, once, and nowhere else; no placeholder anywhere.
    assert [line for line in lines if KEY in line] == [got.format(KEY)]
    assert PLACEHOLDER not in text
    assert "Accept-Encoding: identity" in lines


def test_the_key_echo_request_never_returns_the_key_and_never_reaches_the_provider(
    forwarder: Callable[..., Path],
) -> None:
    """The attack: a tool asks for the placeholder as a path, hoping the forwarder puts the key
    there and the provider's 404 names the path."""
    upstream = echoing()
    try:
        sock = forwarder(upstream.origin)
        bearer = f"Authorization: Bearer {PLACEHOLDER}"
        echo = exchange(sock, ask("GET", f"/v1/{PLACEHOLDER}", bearer))
        # The provider does echo what reaches it (here an allowed request's line).
        shown = exchange(sock, ask("POST", "/v1/chat/completions", bearer, body=b"{}"))
    finally:
        upstream.close()
    assert status(echo) == 400
    assert KEY.encode() not in echo
    assert b"Invalid URL (POST /v1/chat/completions)" in shown
    assert [head.split(b"\r\n", 1)[0] for _, head, _ in upstream.heads] == [
        b"POST /v1/chat/completions HTTP/1.1"
    ]


@pytest.mark.parametrize(
    ("method", "target", "header"),
    [
        ("GET", f"/v1/{PLACEHOLDER}", ""),
        ("GET", f"/v1/{PLACEHOLDER.upper()}", ""),
        ("POST", f"/v1/chat/completions?key={PLACEHOLDER}", ""),
        ("POST", "/v1/chat/completions", f"X-Echo: {PLACEHOLDER}"),
        ("POST", "/v1/chat/completions", f"x-api-key: {PLACEHOLDER}"),  # another api's header
        ("POST", "/v1/chat/completions", f"{PLACEHOLDER}: 1"),
        ("POST", "/v1/chat/completions", f"Connection: {PLACEHOLDER}"),
        ("GET", f"http://tether-provider.invalid/v1/{PLACEHOLDER}", ""),
        ("POST", f"http://{PLACEHOLDER}.example/v1/chat/completions", ""),
    ],
    ids=[
        "target",
        "target-upper",
        "query",
        "other-header",
        "other-key-header",
        "header-name",
        "hop-header",
        "absolute-uri",
        "absolute-uri-host",
    ],
)
def test_the_placeholder_anywhere_but_the_key_header_is_refused_and_not_forwarded(
    forwarder: Callable[..., Path], method: str, target: str, header: str
) -> None:
    upstream = echoing()
    try:
        sock = forwarder(upstream.origin)
        headers = [f"Authorization: Bearer {PLACEHOLDER}", *([header] if header else [])]
        answer = exchange(sock, ask(method, target, *headers, body=b"{}"))
    finally:
        upstream.close()
    assert status(answer) == 400, answer
    assert b"placeholder" in answer
    assert KEY.encode() not in answer
    assert upstream.heads == []
    assert upstream.connections == 0


@pytest.mark.parametrize(
    ("api", "method", "target"),
    [
        ("openai-completions", "DELETE", "/v1/files/x"),
        ("openai-completions", "GET", "/v1/models"),
        ("openai-completions", "GET", "/v1/files/x/content"),
        ("openai-completions", "GET", "/v1/chat/completions"),
        ("openai-completions", "HEAD", "/v1/chat/completions"),
        ("openai-completions", "POST", "/v1/files"),
        ("openai-completions", "POST", "/v1/embeddings"),
        ("openai-completions", "POST", "/v1/chat/completions/../../files"),
        ("openai-completions", "POST", "/v1//chat/completions"),
        ("openai-completions", "POST", "/v1/chat/completions/"),
        ("openai-completions", "POST", "/v1/chat/completions?stream=true"),
        ("openai-completions", "POST", "/v1/chat/completions#x"),
        ("openai-completions", "POST", "/chat/completions"),
        ("openai-completions", "POST", "/v1/responses"),
        ("openai-completions", "POST", "http://tether-provider.invalid/v1/chat/completions"),
        ("openai-completions", "OPTIONS", "*"),
        ("anthropic-messages", "POST", "/v1/messages/batches"),
        ("anthropic-messages", "POST", "/v1/messages/count_tokens?beta=true"),
        ("anthropic-messages", "GET", "/v1/models"),
        ("google-generative-ai", "POST", "/v1beta/models/m:generateContent"),
        ("google-generative-ai", "POST", "/v1beta/models/m:streamGenerateContent"),
        ("google-generative-ai", "POST", "/v1beta/models/..:streamGenerateContent?alt=sse"),
        ("google-generative-ai", "POST", "/v1beta/models/a/b:streamGenerateContent?alt=sse"),
        ("google-generative-ai", "POST", "/v1beta/models/a%2Fb:streamGenerateContent?alt=sse"),
        ("google-generative-ai", "POST", "/v1beta/models/:streamGenerateContent?alt=sse"),
        ("google-generative-ai", "GET", "/v1beta/models"),
        ("google-generative-ai", "DELETE", "/v1beta/files/x"),
    ],
)
def test_a_request_off_the_api_s_list_is_refused_by_the_forwarder_itself(
    forwarder: Callable[..., Path], api: str, method: str, target: str
) -> None:
    base, _, sent, _ = PI_REQUESTS[api]
    upstream = echoing()
    try:
        sock = forwarder(upstream.origin, api=api, base=base)
        answer = exchange(sock, ask(method, target, sent.format(PLACEHOLDER), body=b"{}"))
    finally:
        upstream.close()
    assert status(answer) == 403, answer
    assert KEY.encode() not in answer
    assert upstream.heads == []
    assert upstream.connections == 0


@pytest.mark.parametrize("api", [None, "bedrock-converse-stream"])
def test_a_forwarder_without_a_known_api_passes_nothing_on(
    forwarder: Callable[..., Path], api: str | None
) -> None:
    upstream = echoing()
    try:
        sock = forwarder(upstream.origin, api=api)
        answer = exchange(sock, post(b"{}"))
    finally:
        upstream.close()
    assert status(answer) == 403, answer
    assert upstream.heads == []


def test_a_sandboxed_agent_whose_api_the_forwarder_does_not_know_is_refused_at_once(
    tmp_path: Path,
) -> None:
    text = """
[providers.aws]
base_url = "https://bedrock-runtime.us-east-1.amazonaws.com"
api = "bedrock-converse-stream"
[agents.rev]
provider = "aws"
model = "m"
"""
    cfg = parse_config(text, tmp_path / "tether.toml")
    with pytest.raises(SandboxUnavailable, match="'bedrock-converse-stream' is not one the"):
        provider_keys(cfg, "rev")
    unconfined = parse_config(text + 'sandbox = "none"\n', tmp_path / "tether.toml")
    assert provider_keys(unconfined, "rev") == {}


def _pieces_answer(pieces: list[bytes]) -> Callable[[socket.socket, bytes], bool]:
    """An answer sent in pieces, each its own write after a pause (the forwarder reads each
    on its own); the connection closes after it."""

    def answer(conn: socket.socket, body: bytes) -> bool:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            conn.sendall(piece)
            time.sleep(0.05)
        return False

    return answer


K = KEY.encode()
SPLIT = len(K) // 2
ANSWERS = {
    # name: (the pieces the provider writes, the content pi's client reads from them, how many
    # keys are in the answer's body, framing included)
    "length": (
        [
            b"HTTP/1.1 401 Unauthorized\r\nX-Echo: %s\r\nContent-Length: %d\r\n\r\n"
            % (K, len(b'{"key": "%s", "again": "%s"}' % (K, K))),
            b'{"key": "' + K[:SPLIT],
            K[SPLIT:] + b'", "again": "' + K[:3],
            K[3:] + b'"}',
        ],
        b'{"key": "%s", "again": "%s"}' % (K, K),
        2,
    ),
    "chunked": (
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            # the key across two chunks, and the second chunk's size line in a read of its own
            b"%x\r\ndata: %s\r\n" % (6 + SPLIT, K[:SPLIT]),
            b"%x\r\n" % (len(K) - SPLIT + 2),
            K[SPLIT:] + b"\n\n\r\n",
            # the key whole in one chunk, then cut across two reads inside another
            b"%x\r\n%s\r\n" % (len(K), K),
            b"%x\r\n<%s" % (len(K) + 2, K[:5]),
            K[5:] + b">\r\n0\r\nX-Trailer: %s\r\n\r\n" % K,
        ],
        b"data: %s\n\n%s<%s>" % (K, K, K),
        4,
    ),
    "close": (
        [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nok " + K[:-1], K[-1:] + b" ok"],
        b"ok %s ok" % K,
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_an_answer_carrying_the_key_reaches_pi_without_it(
    forwarder: Callable[..., Path], name: str
) -> None:
    import http.client

    pieces, content, keys = ANSWERS[name]
    upstream = Upstream(_pieces_answer(pieces))
    try:
        data = exchange(forwarder(upstream.origin), post(b"{}"))
    finally:
        upstream.close()
    assert K not in data, data
    # Byte for byte as the provider sent it, but where the key was (content and framing).
    sent = b"".join(pieces)
    assert len(data) - len(sent) == len(b"Connection: close\r\n")
    body, sent_body = data.partition(b"\r\n\r\n")[2], sent.partition(b"\r\n\r\n")[2]
    masked = [i for i, (a, b) in enumerate(zip(body, sent_body, strict=True)) if a != b]
    assert len(masked) == len(K) * keys
    assert all(body[i : i + 1] == b"*" for i in masked)

    class Replay:  # what pi's end of the connection got, read as an HTTP client reads it
        def makefile(self, *args: object, **kwargs: object) -> Any:
            return io.BytesIO(data)

    answer = http.client.HTTPResponse(Replay())  # type: ignore[arg-type]
    answer.begin()
    # The framing as the provider sent it (lengths, chunk sizes), the key masked in place.
    assert answer.read() == content.replace(K, MASK.encode())


def test_a_compressed_answer_is_refused_since_it_cannot_be_checked_for_the_key(
    forwarder: Callable[..., Path],
) -> None:
    import gzip

    packed = gzip.compress(b'{"echo": "%s"}' % K)
    upstream = Upstream(
        _pieces_answer(
            [
                b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                % (len(packed), packed)
            ]
        )
    )
    try:
        data = exchange(forwarder(upstream.origin), post(b"{}"))
    finally:
        upstream.close()
    assert data.startswith(b"HTTP/1.1 502 Bad Gateway"), data
    assert b"compressed (gzip)" in data
    assert packed not in data
    assert b"Accept-Encoding: identity" in upstream.heads[0][1]


@given(
    st.binary(min_size=1, max_size=4).filter(lambda k: b"|" not in k),
    st.lists(st.binary(max_size=12), max_size=8),
    st.data(),
)
@example(b"ab", [b"xa", b"b"], None)
@example(b"aa", [b"a", b"a", b"a"], None)
def test_the_key_never_leaves_the_scrubber_whatever_the_pieces(
    key: bytes, contents: list[bytes], data: Any
) -> None:
    """Content pieces (any bytes, the key cut anywhere across them) with framing between:
    out come the same bytes, framing where it was, content as long, the key nowhere in it and
    every byte not masked as it was; content that ends in no start of the key is not held."""
    contents = [c.replace(b"|", b"") for c in contents]
    alphabet = [key[:1], key[-1:], b"x"]
    if data is not None:  # (pieces made of the key's ends: the key, cut, often)
        contents = [
            b"".join(data.draw(st.lists(st.sampled_from(alphabet), max_size=6))) + c[:2]
            for c in contents
        ]
    scrub = outside._Scrub(key)
    mask = outside._mask(key)
    out, fed, seen = b"", b"", b""
    for i, content in enumerate(contents):
        framing = b"|%d|" % i
        out += scrub.feed(content, framing)
        fed += content + framing
        seen += content
        if not any(key.startswith(seen[-n:]) for n in range(1, min(len(key), len(seen) + 1))):
            assert len(out) == len(fed)  # nothing held back
    out += scrub.end()
    assert len(out) == len(fed)
    framed = [i for i in range(len(fed)) if fed[i : i + 1] == b"|"]
    assert [i for i in range(len(out)) if out[i : i + 1] == b"|"][: len(framed)] == framed
    plain_out = b"".join(out.split(b"|")[::2])
    plain_in = b"".join(fed.split(b"|")[::2])
    assert key not in plain_out
    assert all(a == b or a == mask[0] for a, b in zip(plain_out, plain_in, strict=True))


def refusing(conn: socket.socket, body: bytes) -> bool:
    """A provider that records the request and answers with an error pi shows."""
    reply = b'{"error": {"message": "recorded by the test", "type": "invalid_request_error"}}'
    conn.sendall(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply)
    )
    return True


@pytest.mark.parametrize("api", sorted(PI_REQUESTS))
def test_pi_s_own_requests_for_each_api_pass_the_forwarder(
    forwarder: Callable[..., Path], tmp_path: Path, api: str
) -> None:
    """The real pi, configured as a sandboxed run configures it (the placeholder origin and
    key, its relay to the forwarder's socket), asks its provider once: the request is the
    one the allow-list names, and reaches the provider with the key in its header."""
    base, target, _, got = PI_REQUESTS[api]
    upstream = Upstream(refusing)
    try:
        sock = forwarder(upstream.origin, api=api, base=base)
        agent_dir = tmp_path / "agent"
        agent_dir.mkdir()
        provider = ProviderConfig(base_url=upstream.origin + base, api=api)
        agent = AgentConfig(provider="p", model=PI_MODEL)
        models = pi_models("p", provider, agent, sandboxed=True)
        (agent_dir / "models.json").write_text(json.dumps(models))
        settings = {"retry": {"enabled": False}, "enableInstallTelemetry": False}
        (agent_dir / "settings.json").write_text(json.dumps(settings))
        pi = find_pi()
        relay = extension_file("relay").as_uri()
        pi_print = [str(pi.node), "--import", relay, str(pi.cli), "-p", "--offline"]
        pi_print += ["--no-extensions", "--no-session"]
        done = subprocess.run(
            [*pi_print, "--provider", "p", "--model", PI_MODEL, "--no-tools", "hello"],
            env={
                "PATH": os.environ["PATH"],
                "HOME": str(tmp_path),
                "PI_CODING_AGENT_DIR": str(agent_dir),
                "TETHER_PROVIDER_SOCKET": str(sock),
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        upstream.close()
    # pi got the provider's own answer: the forwarder passed its request on.
    assert "recorded by the test" in done.stdout + done.stderr, (done.stdout, done.stderr)
    assert upstream.heads, done.stderr
    for _, head, _ in upstream.heads:
        lines = head.decode().split("\r\n")
        assert lines[0] == f"POST {target} HTTP/1.1"
        assert [line for line in lines if KEY in line] == [got.format(KEY)]
        assert PLACEHOLDER not in head.decode()


TOOL_PROBE = r"""python3 - <<'EOF'
import os, socket, subprocess
# The provider socket, wherever a tool can find it (its variable is gone from the tools' env).
found = subprocess.run(
    "find / \\( -path /proc -o -path /sys -o -path /dev -o -path /usr \\) -prune -o "
    "-name provider.sock -print 2>/dev/null", shell=True, capture_output=True, text=True
).stdout.split()
named = os.environ.get("TETHER_PROVIDER_SOCKET")
paths = list(dict.fromkeys(([named] if named else []) + found))
print("sockets:", paths)
bearer = b"Authorization: Bearer tether-no-key\r\n"
asks = [
    b"GET /v1/tether-no-key HTTP/1.1\r\nHost: x\r\n" + bearer + b"\r\n",
    b"GET http://tether-provider.invalid/v1/tether-no-key HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + bearer + b"\r\n",
    b"DELETE /v1/files/x HTTP/1.1\r\nHost: x\r\n" + bearer + b"\r\n",
    b"POST /v1/chat/completions?key=tether-no-key HTTP/1.1\r\nHost: x\r\n"
    + bearer + b"Content-Length: 2\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Echo: tether-no-key\r\n"
    + bearer + b"Content-Length: 2\r\n\r\n{}",
]
for path in paths:
    for ask in asks:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        try:
            s.connect(path)
            s.sendall(ask)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        except OSError as exc:
            print("UNREACHABLE", path, exc)
            continue
        finally:
            s.close()
        print("ANSWER", data.split(b"\r\n", 1)[0].decode(errors="replace"))
        print(data.decode(errors="replace")[-300:])
EOF"""


def test_a_tool_asking_the_provider_socket_for_the_key_never_gets_it(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """Through the real pi in its sandbox, a bash tool call (as a prompt injection would make
    it) finds the provider socket, if it can reach it, and asks it for the key every way the
    forwarder refuses. The forwarder answers each itself (400 or 403), and the key is in no
    tool result, row or file; a tool that cannot reach the socket at all gets nothing either."""
    key = "sk-tool-probe-" + os.urandom(12).hex()
    # pi's first request gets the tool call; any other request (pi's next, or one of the
    # tool's that got through) gets the answer.
    probe = Reply(tool_calls=[ToolCall("bash", {"command": TOOL_PROBE})])
    p = scripted_provider(lambda req: probe if req.index == 0 else Reply("probe done"))
    (tmp_path / "state").mkdir()
    ledger = f"sqlite://{tmp_path}/state/ledger.db"
    hosted = {"base_url": p.url, "api_key_env": "TETHER_TEST_PROVIDER_KEY"}
    cfg = write_config(
        tmp_path,
        ledger={"url": ledger},
        providers={"local": None, "hosted": {**hosted, "context_window": 8192, "max_tokens": 1024}},
        agents={"rev": {"provider": "hosted", "deadline_s": 120}},
        harness={"runs_dir": "state/runs", "pi_settings": {"retry": {"enabled": False}}},
    )
    tether_run = [sys.executable, "-m", "tether", "run", "--config", str(cfg)]
    done = subprocess.run(
        [*tether_run, "-s", "s1", "-a", "rev", "--json", "probe"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "TETHER_TEST_PROVIDER_KEY": key},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "probe done"
    with open_ledger(ledger) as store:
        rows = list(store.iter_rows("s1"))
    (result,) = [r for r in rows if r.role == "toolResult"]
    text = "".join(c.get("text", "") for c in result.body["content"])
    assert "sockets:" in text, text
    # Reached or not (a tool sandbox of its own may not see the socket), never the key.
    assert key not in text
    assert all(key not in json.dumps(r.body) for r in rows)
    # Each request that reached the socket was answered by the forwarder itself.
    statuses = [line.split()[2] for line in text.splitlines() if line.startswith("ANSWER")]
    assert set(statuses) <= {"400", "403"}, text
    for where in (tmp_path / "state", tmp_path / "work"):
        for root, _, names in os.walk(where):
            for name in names:
                path = Path(root) / name
                if path.is_file():
                    assert key.encode() not in path.read_bytes(), path
    # pi's own requests, and only those, reached the provider, with the key.
    assert [r.path for r in p.requests] == ["/v1/chat/completions"] * 2, p.requests
    assert {r.headers.get("Authorization") for r in p.requests} == {f"Bearer {key}"}
