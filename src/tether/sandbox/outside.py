"""Outside the sandbox: start it, and forward pi's provider calls with the credential.

    python -I -S outside.py --socket PATH --upstream URL --api NAME [--base-path BASE]
        [--limit NAME=N ...] -- BWRAP_ARGV...

Started in pi's place (by the keeper, or by the harness when pi is its child), this program

- starts ``BWRAP_ARGV`` (pi in its sandbox) at once, with the limits set (hard and soft) in the
  child before it execs, and the provider key's descriptor (``TETHER_KEY_FD``) neither inherited
  nor named in its environment: the key never enters the sandbox;
- serves the provider forwarder on the Unix socket ``PATH`` (in a directory bound into the
  sandbox): each connection carries one HTTP request from pi (whose connections to its
  placeholder provider host land here: ``extension/relay.ts``). Only the requests pi's client
  for the api ``NAME`` makes, under the base URL's path ``BASE``, are passed on (anything else
  is refused with 403), and one carrying the placeholder pi was configured with anywhere but in
  the api's key header is refused with 400; the head gets the credential in that one header
  and the upstream's ``Host``; the request goes to ``URL``'s host (TLS for ``https``) over a
  connection kept alive for the next one, and the answer comes back as it arrives (streaming,
  unbuffered), its head saying ``Connection: close``, with the key masked wherever it echoes
  it (docs/security.md, "The provider forwarder");
- exits with the sandbox's status (128 + N when it was killed by signal N). Killed itself, it
  takes nothing with it: pi's end is the sandbox's first process ending.

It imports nothing beyond the standard library (like the keeper, it runs as ``python -I -S``)
and only ``os`` and ``sys`` before the sandbox is started.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (no stubs: the builtin under signal)
import _socket
import _thread
import os
import sys

TYPE_CHECKING = False

KEY_FD_ENV = "TETHER_KEY_FD"
PLACEHOLDER_ENV = "TETHER_KEY_PLACEHOLDER"
LIMIT_NAMES = {"nproc": "RLIMIT_NPROC", "data": "RLIMIT_DATA", "fsize": "RLIMIT_FSIZE"}
_HEAD_MAX = 256 * 1024
_CHUNK = 64 * 1024
_CLOSE_WAIT_S = 30.0
_HOP_BY_HOP = (b"connection", b"keep-alive", b"proxy-connection", b"host", b"upgrade", b"te")
_ANSWER_HOP = (b"connection", b"keep-alive", b"proxy-connection")
_IDLE_MAX = 4
"""Upstream connections kept idle at most (pi sends one request at a time; a checkpoint's
summary may overlap a relayed one)."""


_KEY_FIELD = '"key": "'


def _read_key(fd: int | None) -> bytes:
    """The provider key from its pipe (written whole before this program started), or b""."""
    if fd is None:
        return b""
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
    # One run, one provider: the forwarder serves the first grant's key. The channel is
    # json.dumps of [{"provider": …, "key": …}, …] (tether.pi.keys): ASCII, its separators the
    # defaults, and a quote inside a string always escaped, so the first '"key": "' is the
    # first grant's key. The json module's import (re, enum) would cost this process about
    # 6 ms of CPU a run; the stdlib's own C string scanner, which json uses, reads the key.
    from _json import scanstring

    text = data.decode("ascii")
    at = text.find(_KEY_FIELD)
    if at < 0:
        return b""
    key: str = scanstring(text, at + len(_KEY_FIELD))[0]
    return key.encode()


def _limit(limits: list[tuple[int, int]]) -> None:
    """In a child about to exec a sandbox: the limits, hard and soft, and the signals Python
    ignores back at their defaults (a write over the file size limit then ends the writer, as
    it would in a shell)."""
    import resource

    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    for which, value in limits:
        # Never above the hard limit this process already has (raising it is refused).
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _start(
    argv: list[str], env: dict[str, str], limits: list[tuple[int, int]], key_fd: int | None
) -> int:
    pid = os.fork()
    if pid == 0:  # the child: limits first, then the sandbox
        try:
            if key_fd is not None:
                os.close(key_fd)  # the key's pipe stays outside
            _limit(limits)
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, f"tether: cannot start the sandbox ({argv[0]}): {exc}\n".encode())
        os._exit(127)
    return pid


class _Refusal(Exception):
    """A request the forwarder answers itself: its status line and why."""

    def __init__(self, status: str, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


_MODEL = "{model}"
_APIS: dict[str, tuple[bytes, bytes, tuple[tuple[str, str, tuple[str, ...]], ...]]] = {
    # api: (the one header that carries the key, what precedes the key in it, and the requests
    # pi's client for it makes: (method, path under the base URL's, the queries it adds)).
    # Seen from pi 1.6 (pi-ai's clients), each api against a recording server.
    "openai-completions": (b"Authorization", b"Bearer ", (("POST", "/chat/completions", ("",)),)),
    "openai-responses": (b"Authorization", b"Bearer ", (("POST", "/responses", ("",)),)),
    "anthropic-messages": (b"x-api-key", b"", (("POST", "/v1/messages", ("beta=true", "")),)),
    "google-generative-ai": (
        b"x-goog-api-key",
        b"",
        (("POST", "/models/" + _MODEL + ":streamGenerateContent", ("alt=sse",)),),
    ),
    "mistral-conversations": (
        b"Authorization",
        b"Bearer ",
        (("POST", "/v1/chat/completions", ("",)),),
    ),
}
FORWARDED_APIS = tuple(_APIS)
"""The provider apis a sandboxed pi can use: the forwarder knows what each one sends."""
_MODEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


class _Api:
    """What the forwarder passes on for one provider api under the base URL's path: its
    requests (method, path and query, exactly), and the header the key goes in."""

    def __init__(self, name: str, base: str) -> None:
        self.name = name
        header, self.scheme, routes = _APIS.get(name, (b"", b"", ()))
        self.header, self.header_lower = header, header.lower()
        base = base.rstrip("/")
        self.routes = [(method, base + path, queries) for method, path, queries in routes]

    def allows(self, method: str, target: str) -> bool:
        path, _, query = target.partition("?")
        for allowed, where, queries in self.routes:
            if method != allowed or query not in queries:
                continue
            before, model, after = where.partition(_MODEL)
            if not model:
                if path == where:
                    return True
                continue
            # One path segment of a model's name in its place (no slash, no dot segment).
            name = path[len(before) : len(path) - len(after)]
            if (
                path.startswith(before)
                and path.endswith(after)
                and len(path) > len(before) + len(after)
                and name[0] != "."
                and all(c in _MODEL_CHARS for c in name)
            ):
                return True
        return False


def _upstream_request(
    head: bytes, *, key: bytes, placeholder: bytes, api: _Api
) -> tuple[str, str, list[tuple[bytes, bytes]], int]:
    """pi's request head as the upstream gets it: method, target and headers, without what
    belongs to one connection (the forwarder sets ``Host`` and the length itself), the key in
    the api's own header and nowhere else; and the body's length. Only the api's requests are
    passed on (403 otherwise), and the placeholder anywhere but in the key's header is refused
    (400): nothing pi's tools send can put the key where an answer could echo it. Raises
    :class:`_Refusal`."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refusal("400 Bad Request", "not an HTTP/1.1 request line")
    method, target = parts[0], parts[1]
    if not api.routes:
        raise _Refusal("403 Forbidden", f"it passes on no api's requests ({api.name or 'none'})")
    marker = placeholder.lower()
    if marker and marker in target.lower():
        raise _Refusal("400 Bad Request", "the key's placeholder in the request target")
    headers: list[tuple[bytes, bytes]] = []
    length = 0
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        lower = name.strip().lower()
        if not sep or not lower:
            raise _Refusal("400 Bad Request", "a malformed header line")
        if lower == api.header_lower:
            if not key:  # a keyless provider: as pi sent it
                headers.append((name.strip(), value.strip()))
            continue
        if marker and marker in line.lower():
            why = f"the key's placeholder in a header other than {api.header.decode()}"
            raise _Refusal("400 Bad Request", why)
        if lower == b"content-length":
            if not value.strip().isdigit():
                raise _Refusal("400 Bad Request", "a malformed Content-Length")
            length = int(value)
        elif lower == b"transfer-encoding":
            raise _Refusal("411 Length Required", "a request body needs a Content-Length")
        elif lower not in _HOP_BY_HOP and lower != b"accept-encoding":
            headers.append((name.strip(), value.strip()))
    try:
        method_text, target_text = method.decode("ascii"), target.decode("ascii")
    except UnicodeDecodeError:
        raise _Refusal("400 Bad Request", "a request line that is not ASCII") from None
    if not api.allows(method_text, target_text):
        why = (
            f"{method_text} {target_text.partition('?')[0]} is not a request of the {api.name} api"
        )
        raise _Refusal("403 Forbidden", why)
    if key:
        headers.append((api.header, api.scheme + key))
    # An answer's body is checked for the key byte by byte: never compressed.
    headers.append((b"Accept-Encoding", b"identity"))
    return method_text, target_text, headers, length


def _end_writes(sock: _socket.socket) -> None:
    try:  # noqa: SIM105  (contextlib is not imported here: this program starts pi)
        sock.shutdown(_socket.SHUT_WR)
    except OSError:
        pass


def _refuse(client: _socket.socket, status: str, why: str) -> None:
    body = f"tether's provider forwarder: {why}\n".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    try:  # noqa: SIM105
        client.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)
    except OSError:
        pass


def _read_head(sock: _socket.socket) -> tuple[bytes, bytes] | None:
    """A request head (without its blank line) and what came after it; None at end of file
    first. Raises :class:`_Refusal` when the head is over ``_HEAD_MAX``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(_CHUNK)
        if not chunk:
            return None
        data += chunk
        if len(data) > _HEAD_MAX:
            raise _Refusal("431 Request Header Fields Too Large", "request head too large")
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def _connect(address: bytes, port: int) -> _socket.socket:
    """A TCP connection to the first of ``address``'s addresses that answers (as
    ``socket.create_connection``, on the builtin ``_socket``). Raises ``OSError``."""
    failure: OSError = OSError(f"no address for {address!r}")
    for family, kind, proto, _, where in _socket.getaddrinfo(address, port, 0, _socket.SOCK_STREAM):
        conn = _socket.socket(family, kind, proto)
        try:
            conn.settimeout(30)
            conn.connect(where)
        except OSError as exc:
            conn.close()
            failure = exc
            continue
        # Connected: an answer may pause for as long as the model thinks.
        conn.settimeout(None)
        conn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        return conn
    raise failure


class _Upstream:
    """The provider's origin, and its connections kept alive between pi's requests (pi sends
    one at a time; a fresh TCP and TLS handshake per request would cost a remote provider
    several round trips each time)."""

    def __init__(self, scheme: str, host: str, port: int) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        default = 443 if scheme == "https" else 80
        self.netloc = host if port == default else f"{host}:{port}"
        self._idle: list[_socket.socket] = []
        self._lock = _thread.allocate_lock()

    def take(self) -> tuple[_socket.socket, bool]:
        """An idle connection (and True), or a new one (and False). Raises ``OSError``."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        # The address as bytes: a str would import the idna codec, a few ms of a first request.
        address = self.host.encode("ascii") if self.host.isascii() else self.host.encode("idna")
        conn = _connect(address, self.port)
        if self.scheme == "https":
            import socket
            import ssl

            wrapped = socket.socket(fileno=conn.detach())
            context = ssl.create_default_context()
            return context.wrap_socket(wrapped, server_hostname=self.host), False
        return conn, False

    def give_back(self, conn: _socket.socket) -> None:
        with self._lock:
            if len(self._idle) < _IDLE_MAX:
                self._idle.append(conn)
                return
        conn.close()


class _Answer:
    """The upstream's answer on one connection, passed on as it arrives. Its framing (RFC
    9112: a length, chunks, or the connection's end) is followed, not undone, to know where the
    answer ends and whether the connection can take another request. (http.client would find
    that too, but it undoes the chunks, and costs 16 ms of imports at every run's start.)"""

    def __init__(self, conn: _socket.socket) -> None:
        self.conn = conn
        self.buf = b""
        self.started = False  # a byte came: a failure now is not a stale kept connection's
        self.head = b""
        self.length: int | None = None
        self.chunked = self.reusable = self._done = False
        self._chunk_left = 0
        self.content = 0
        """How many of the bytes :meth:`read` last gave are the answer's content (they come
        first); the rest are its framing (a chunk's size line or CRLF, the last chunk)."""

    def begin(self, method: str) -> None:
        """Read the answer's head (past any interim 1xx one) and learn its framing."""
        while True:
            head = self._head()
            status = head.split(b"\r\n", 1)[0].split(b" ", 2)
            if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
                raise ValueError("not an HTTP/1.1 answer")
            code = int(status[1])
            if code >= 200 or code == 101:
                break  # (an interim 1xx answer, such as 103, goes by)
        self.head = head
        fields: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        self.chunked = b"chunked" in fields.get(b"transfer-encoding", b"")
        if method == "HEAD" or code in (204, 304):
            self.length = 0
        elif not self.chunked and fields.get(b"content-length", b"").isdigit():
            self.length = int(fields[b"content-length"])
        framed = self.chunked or self.length is not None
        self.reusable = (
            framed and status[0] == b"HTTP/1.1" and b"close" not in fields.get(b"connection", b"")
        )

    def _fill(self) -> None:
        chunk = self.conn.recv(_CHUNK)
        if not chunk:
            raise EOFError("the provider closed the connection mid-answer")
        self.started = True
        self.buf += chunk

    def _until(self, mark: bytes, what: str) -> bytes:
        """What comes before ``mark`` (taken, with the mark), at most ``_HEAD_MAX`` bytes."""
        while mark not in self.buf:
            if len(self.buf) > _HEAD_MAX:
                raise ValueError(f"{what} of the provider's answer is too long")
            self._fill()
        found, self.buf = self.buf.split(mark, 1)
        return found

    def _head(self) -> bytes:
        return self._until(b"\r\n\r\n", "the head")

    def _line(self) -> bytes:
        return self._until(b"\r\n", "a chunk line")

    def _take(self, most: int) -> bytes:
        if not self.buf:
            self._fill()
        out, self.buf = self.buf[:most], self.buf[most:]
        return out

    def pi_head(self) -> bytes:
        """The head for pi: as it came, framing included, but ``Connection: close`` in place
        of what belongs to the upstream's connection."""
        lines = self.head.split(b"\r\n")
        kept = [ln for ln in lines[1:] if ln.split(b":", 1)[0].strip().lower() not in _ANSWER_HOP]
        return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n"

    def read(self) -> bytes:
        """The next bytes of the answer as they arrive, byte for byte (chunks keep their
        framing: an answer cut short stays one, for pi's client to see); b"" at its end."""
        self.content = 0
        if self._done:
            return b""
        if self.chunked:
            if self._chunk_left == 0:
                line = self._line()
                size = line.split(b";", 1)[0].strip()
                if not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
                    raise ValueError("a malformed chunk in the provider's answer")
                self._chunk_left = int(size, 16)
                if self._chunk_left == 0:  # the last chunk, then the trailer to its blank line
                    out = line + b"\r\n"
                    while trailer := self._line():
                        out += trailer + b"\r\n"
                    self._done = True
                    return out + b"\r\n"
                return line + b"\r\n"
            out = self._take(self._chunk_left)
            self._chunk_left -= len(out)
            self.content = len(out)
            if self._chunk_left == 0:  # the chunk's data ends with CRLF
                while len(self.buf) < 2:
                    self._fill()
                if self.buf[:2] != b"\r\n":
                    raise ValueError("a malformed chunk in the provider's answer")
                self.buf = self.buf[2:]
                out += b"\r\n"
            return out
        if self.length is not None:
            if self.length == 0:
                self._done = True
                return b""
            out = self._take(self.length)
            self.length -= len(out)
            self.content = len(out)
            return out
        # Ended by the connection's end.
        if not self.buf:
            chunk = self.conn.recv(_CHUNK)
            if not chunk:
                self._done = True
                return b""
            self.content = len(chunk)
            return chunk
        out, self.buf = self.buf, b""
        self.content = len(out)
        return out

    @property
    def done(self) -> bool:
        return self._done and not self.buf


def _ask(up: _Upstream, request: bytes, method: str) -> tuple[_socket.socket, _Answer]:
    """Send ``request`` upstream; the connection and its answer, its head read. Raises
    :class:`_Refusal` (502) when the provider cannot be reached or answers no head."""
    for attempt in (1, 2):
        try:
            conn, reused = up.take()
        except (OSError, UnicodeError) as exc:
            raise _Refusal(
                "502 Bad Gateway", f"cannot reach {up.scheme}://{up.netloc}: {exc}"
            ) from None
        answer = _Answer(conn)
        try:
            conn.sendall(request)
            answer.begin(method)
            return conn, answer
        except (OSError, EOFError, ValueError) as exc:
            conn.close()
            # A kept connection the provider closed while it was idle: once more, on a new
            # one (no byte of an answer came: the request never reached it).
            if not (reused and attempt == 1 and not answer.started):
                raise _Refusal("502 Bad Gateway", f"the provider's answer failed: {exc}") from None
    raise AssertionError("unreachable")


def _mask(key: bytes) -> bytes:
    """What stands for the key in an answer: as long as the key (a length or a chunk's size
    stays right), of one byte the key does not hold (so no mask, beside what surrounds it,
    can make up the key again)."""
    fill = next(c for c in (*b"*#~^", *range(256)) if c not in key)
    return bytes([fill]) * len(key)


def _key_start(text: bytes, key: bytes) -> int:
    """How long the longest end of ``text`` is that begins the key (shorter than the key)."""
    first = key[:1]
    at = text.find(first, max(0, len(text) - len(key) + 1))
    while at >= 0:
        if key.startswith(text[at:]):
            return len(text) - at
        at = text.find(first, at + 1)
    return 0


class _Scrub:
    """The answer's bytes for pi, with the key nowhere in them: in the content (a chunked
    answer's chunks joined, as pi's client reads them) and in each piece of framing, every
    occurrence becomes a mask of its length, so the framing, lengths and chunk sizes stay as
    the upstream sent them. Content that may begin the key waits for what follows (at most
    ``len(key) - 1`` bytes, and only while they match the key's start: a stream's events are
    not held back), and the framing after it with it."""

    def __init__(self, key: bytes) -> None:
        self.key, self.mask = key, _mask(key) if key else b""
        self.out = bytearray()  # held back: content that may begin the key, framing after it
        self.held: list[int] = []  # where that content is in out

    def head(self, head: bytes) -> bytes:
        return head.replace(self.key, self.mask) if self.key else head

    def feed(self, content: bytes, framing: bytes = b"") -> bytes:
        """What can go to pi now, of what came: ``content``, then ``framing``."""
        key, held, out = self.key, self.held, self.out
        if not key:
            return content + framing
        text = bytes(out[i] for i in held) + content
        if key in text:
            text = text.replace(key, self.mask)  # (as long: every position stays)
            for j, i in enumerate(held):
                out[i] = text[j]
            content = text[len(held) :]
        keep = _key_start(text, key)
        if keep <= len(content):
            ready = bytes(out) + content[: len(content) - keep]
            self.out = out = bytearray(content[len(content) - keep :])
            self.held = list(range(keep))
        else:  # some of what was held stays held
            first = held[len(held) - (keep - len(content))]
            ready = bytes(out[:first])
            self.held = [i - first for i in held[len(held) - (keep - len(content)) :]]
            self.held += range(len(out) - first, len(out) - first + len(content))
            self.out = out = out[first:] + content
        framing = framing.replace(key, self.mask)
        if self.held:
            out += framing
            return ready
        return ready + framing

    def end(self) -> bytes:
        """What was held back, at the answer's end (it cannot be the key any more)."""
        rest = bytes(self.out)
        self.out, self.held = bytearray(), []
        return rest


def _compressed(head: bytes) -> bytes:
    """The answer's content coding, when it has one (not ``identity``)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-encoding" and value.strip().lower() != b"identity":
            return value.strip()
    return b""


def _handle(
    client: _socket.socket, up: _Upstream, key: bytes, placeholder: bytes, api: _Api
) -> None:
    try:
        try:
            received = _read_head(client)
            if received is None:
                return
            head, body = received
            method, target, headers, length = _upstream_request(
                head, key=key, placeholder=placeholder, api=api
            )
        except _Refusal as refusal:
            _refuse(client, refusal.status, refusal.why)
            return
        while len(body) < length and (chunk := client.recv(_CHUNK)):
            body += chunk
        if len(body) < length:
            return  # pi went away mid-request: nothing to send, nobody to answer
        body = body[:length]
        lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: " + up.netloc.encode()]
        lines += [name + b": " + value for name, value in headers]
        if body or method not in ("GET", "HEAD"):
            lines.append(b"Content-Length: %d" % len(body))
        request = b"\r\n".join(lines) + b"\r\n\r\n" + body
        try:
            conn, answer = _ask(up, request, method)
        except _Refusal as refusal:
            _refuse(client, refusal.status, refusal.why)
            return
        if key and (coding := _compressed(answer.head)):
            conn.close()  # (its content could hold the key, where no byte can be checked)
            why = f"the provider's answer is compressed ({coding.decode('latin-1')})"
            _refuse(client, "502 Bad Gateway", why)
            return
        scrub = _Scrub(key)  # the key never goes back to pi, whatever the answer echoes
        try:
            client.sendall(scrub.head(answer.pi_head()))
            while chunk := answer.read():  # as it arrives: streaming, unbuffered
                if ready := scrub.feed(chunk[: answer.content], chunk[answer.content :]):
                    client.sendall(ready)
            if rest := scrub.end():
                client.sendall(rest)
        except (OSError, EOFError, ValueError):
            conn.close()  # mid-answer: neither side can go on
            raise
        if answer.reusable and answer.done:
            up.give_back(conn)
        else:
            conn.close()
        _end_writes(client)
        # pi closes once it has the whole answer: closing first could reset the connection
        # under a request it is still ending (EPIPE there, a lost answer).
        client.settimeout(_CLOSE_WAIT_S)
        while client.recv(_CHUNK):
            pass
    except (OSError, EOFError, ValueError):
        pass
    finally:
        client.close()


def _serve(
    path: str, upstream: tuple[str, str, int], key: bytes, placeholder: bytes, api: _Api
) -> None:
    try:  # noqa: SIM105
        os.unlink(path)
    except FileNotFoundError:
        pass
    # Bound and listening under a short name of its own first, then renamed into place: a
    # client that finds the path never meets a socket that is not listening yet (refused).
    fresh = os.path.join(os.path.dirname(path), ".new")
    try:  # noqa: SIM105
        os.unlink(fresh)
    except FileNotFoundError:
        pass
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is 0600 from the start
    try:
        listener.bind(fresh)
    finally:
        os.umask(old)
    listener.listen(64)
    os.rename(fresh, path)
    up = _Upstream(*upstream)
    while True:
        fd, _ = listener._accept()  # type: ignore[attr-defined]  # (the C method accept wraps)
        client = _socket.socket(fileno=fd)
        _thread.start_new_thread(_handle, (client, up, key, placeholder, api))


def _parse_upstream(url: str) -> tuple[str, str, int]:
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    host, sep, port = netloc.rpartition(":")
    if not sep or not port.isdigit() or host.endswith(":"):  # no port (or a bare IPv6 address)
        host, port = netloc, "443" if scheme == "https" else "80"
    return scheme, host.strip("[]"), int(port)


def _tools_listener(path: str) -> _socket.socket:
    """The tool host's listening socket, bound 0600 at ``path`` (in a directory of pi's)."""
    try:  # noqa: SIM105
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    return listener


def _start_tools(
    spec_path: str, listener: _socket.socket, log_path: str, limits: list[tuple[int, int]]
) -> int:
    """The tool sandbox (its argv and environment from the spec file, which is then removed:
    the agent's ``env`` may hold credentials), with the listener as descriptor 3 and nothing
    else of this process: not pi's pipes, not the key's. Its output goes to ``log_path``."""
    with open(spec_path, "rb") as f:
        fields = f.read().decode().split("\0")
    os.unlink(spec_path)
    split = fields.index("")
    argv, env_fields = fields[:split], fields[split + 1 :]
    env = dict(item.split("=", 1) for item in env_fields if "=" in item)
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(log, 2)
            if listener.fileno() != 3:
                os.dup2(listener.fileno(), 3)
            # (dup2 onto itself changes nothing: the socket's close-on-exec goes either way)
            os.set_inheritable(3, True)
            os.closerange(4, 65536)
            _limit(limits)
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, f"tether: cannot start the tool sandbox ({argv[0]}): {exc}\n".encode())
        os._exit(127)
    listener.close()  # the host's now; pi reaches it by its path
    return pid


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(
            "usage: outside.py --socket PATH --upstream URL --api NAME [--base-path BASE] "
            "[--limit NAME=N] "
            "[--tools-socket PATH --tools-spec FILE --tools-log FILE] -- ARGV",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    socket_path = upstream = tools_socket = tools_spec = tools_log = ""
    wanted: list[tuple[str, int]] = []
    api_name = base_path = ""
    for name, value in zip(options[::2], options[1::2], strict=True):
        if name == "--socket":
            socket_path = value
        elif name == "--upstream":
            upstream = value
        elif name == "--api":  # what the forwarder passes on, and where the key goes
            api_name = value
        elif name == "--base-path":  # the path of the provider's base URL ("/v1")
            base_path = value
        elif name == "--limit":
            which, _, number = value.partition("=")
            wanted.append((LIMIT_NAMES[which], int(number)))
        elif name == "--tools-socket":
            tools_socket = value
        elif name == "--tools-spec":
            tools_spec = value
        elif name == "--tools-log":
            tools_log = value
    env = dict(os.environ)
    fd_text = env.pop(KEY_FD_ENV, "")
    key_fd = int(fd_text) if fd_text.isdigit() else None
    placeholder = env.pop(PLACEHOLDER_ENV, "").encode()
    limits: list[tuple[int, int]] = []
    if wanted:
        import resource

        limits = [(getattr(resource, name), value) for name, value in wanted]
    # Listening before pi starts: its first tool call finds the host's socket there.
    listener = _tools_listener(tools_socket) if tools_socket and tools_spec else None
    pid = _start(command, env, limits, key_fd)
    # The key is read while the sandbox starts: pi asks for nothing before it has loaded.
    key = _read_key(key_fd)
    if listener is not None:
        _start_tools(tools_spec, listener, tools_log or os.devnull, limits)

    # The sandbox is starting: now the forwarder, on the builtins _thread and _signal (the
    # threading and signal modules cost more to import than the rest of this program).
    _signal.signal(_signal.SIGHUP, _signal.SIG_IGN)  # like the keeper: only pi's end ends this
    if socket_path and upstream:
        args = (socket_path, _parse_upstream(upstream), key, placeholder, _Api(api_name, base_path))
        _thread.start_new_thread(_serve, args)
    while True:
        # The tool sandbox may end first (it dies with this process otherwise): pi's end is
        # what ends this program.
        done, status = os.waitpid(-1, 0)
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
