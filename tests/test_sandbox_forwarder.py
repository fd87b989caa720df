"""The provider's path out of the sandbox, piece by piece (DESIGN §3.12): the forwarder
(``tether/sandbox/outside.py``, run as a sandboxed run runs it) over its Unix socket against an
upstream this test plays, and pi's relay (``extension/js/relay.js``) in the real Node, which
turns connections to the placeholder host into connections to that socket."""

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

from tether.pi.install import extension_file, find_pi
from tether.pi.keys import key_channel
from tether.sandbox import outside
from tether.sandbox.bwrap import OUTSIDE_SCRIPT, PROVIDER_ORIGIN

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
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (OSError, ssl.SSLError):
                    conn.close()
                    continue
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

    def start(origin: str, **extra_env: str) -> Path:
        path = tmp_path / f"provider-{len(started)}.sock"
        with key_channel({"local": KEY}) as channel:  # the harness's own channel
            read = os.dup(channel.pass_fds[0])
        env = {**os.environ, "TETHER_KEY_FD": str(read), "TETHER_KEY_PLACEHOLDER": PLACEHOLDER}
        env.update(extra_env)
        argv = [sys.executable, "-I", "-S", str(OUTSIDE_SCRIPT), "--socket", str(path)]
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


def post(body: bytes, *, path: str = f"/v1/chat?key={PLACEHOLDER}") -> bytes:
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
        assert text.startswith(f"POST /v1/chat?key={KEY} HTTP/1.1")
        assert f"Authorization: Bearer {KEY}" in text
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
