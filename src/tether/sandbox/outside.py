"""Outside the sandbox: start it, and forward pi's provider calls with the credential.

    python -I -S outside.py --socket PATH --upstream URL [--limit NAME=N ...] -- BWRAP_ARGV...

Started in pi's place (by the keeper, or by the harness when pi is its child), this program

- starts ``BWRAP_ARGV`` (pi in its sandbox) at once, with the limits set (hard and soft) in the
  child before it execs, and the provider key's descriptor (``TETHER_KEY_FD``) neither inherited
  nor named in its environment: the key never enters the sandbox;
- serves the provider forwarder on the Unix socket ``PATH`` (in a directory bound into the
  sandbox): each connection carries one HTTP request from pi's relay (``extension/relay.ts``),
  whose head gets the credential in place of the placeholder pi was configured with, the
  upstream's ``Host`` and ``Connection: close``; the request goes to ``URL``'s host (TLS for
  ``https``) and the answer comes back byte for byte as it arrives (streaming, unbuffered);
- exits with the sandbox's status (128 + N when it was killed by signal N). Killed itself, it
  takes nothing with it: pi's end is the sandbox's first process ending.

It imports nothing beyond the standard library (like the keeper, it runs as ``python -I -S``)
and only ``os`` and ``sys`` before the sandbox is started.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (no stubs: the builtin under signal)
import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any

KEY_FD_ENV = "TETHER_KEY_FD"
PLACEHOLDER_ENV = "TETHER_KEY_PLACEHOLDER"
LIMIT_NAMES = {"nproc": "RLIMIT_NPROC", "data": "RLIMIT_DATA", "fsize": "RLIMIT_FSIZE"}
_HEAD_MAX = 256 * 1024
_CHUNK = 64 * 1024
_CLOSE_WAIT_S = 30.0
_HOP_BY_HOP = (b"connection", b"keep-alive", b"proxy-connection", b"host", b"upgrade")


def _read_key(env: dict[str, str]) -> bytes:
    """The provider key from its pipe (written whole before this program started), or b""."""
    text = env.pop(KEY_FD_ENV, "")
    if not text.isdigit():
        return b""
    fd = int(text)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
    import json

    grants = json.loads(data or b"[]")
    # One run, one provider: the forwarder serves the agent's provider only.
    return str(grants[0]["key"]).encode() if grants else b""


def _start(argv: list[str], env: dict[str, str], limits: list[tuple[int, int]]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: limits first, then the sandbox
        try:
            import resource

            # Python ignores these; the sandbox gets them back at their defaults (a write over
            # the file size limit then ends the writer, as it would in a shell).
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
                _signal.signal(sig, _signal.SIG_DFL)
            for which, value in limits:
                # Never above the hard limit this process already has (raising it is refused).
                hard = resource.getrlimit(which)[1]
                if hard != resource.RLIM_INFINITY:
                    value = min(value, hard)
                resource.setrlimit(which, (value, value))
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, f"tether: cannot start the sandbox ({argv[0]}): {exc}\n".encode())
        os._exit(127)
    return pid


def _rewrite_head(head: bytes, *, key: bytes, placeholder: bytes, host: bytes) -> bytes:
    """pi's request head for the upstream: the credential in place of the placeholder (in the
    request line and every header: the API decides where its key goes), the upstream's host,
    one request per connection."""
    lines = head.split(b"\r\n")
    out = [lines[0].replace(placeholder, key) if key else lines[0]]
    for line in lines[1:]:
        if not line:
            continue
        name = line.split(b":", 1)[0].strip().lower()
        if name in _HOP_BY_HOP:
            continue
        out.append(line.replace(placeholder, key) if key else line)
    out += [b"Host: " + host, b"Connection: close"]
    return b"\r\n".join(out) + b"\r\n\r\n"


def _pump(src: socket.socket, dst: socket.socket, done: Any = None) -> None:
    """``src`` to ``dst`` until end of file, then end of file to ``dst``; ``done`` (a held
    lock) is released at the end."""
    try:
        while chunk := src.recv(_CHUNK):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        import socket as _socket

        try:  # noqa: SIM105  (contextlib is not imported here: this program starts pi)
            dst.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
        if done is not None:
            done.release()


def _refuse(client: socket.socket, status: str, why: str) -> None:
    body = f"tether's provider forwarder: {why}\n".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    try:  # noqa: SIM105
        client.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)
    except OSError:
        pass


def _handle(
    client: socket.socket, upstream: tuple[str, str, int], key: bytes, placeholder: bytes
) -> None:
    import socket

    scheme, host, port = upstream
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = client.recv(_CHUNK)
            if not chunk:
                return
            data += chunk
            if len(data) > _HEAD_MAX:
                _refuse(client, "431 Request Header Fields Too Large", "request head too large")
                return
        head, rest = data.split(b"\r\n\r\n", 1)
        default = 443 if scheme == "https" else 80
        netloc = host if port == default else f"{host}:{port}"
        head = _rewrite_head(head, key=key, placeholder=placeholder, host=netloc.encode())
        try:
            server = socket.create_connection((host, port), timeout=30)
            server.settimeout(None)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                import ssl

                server = ssl.create_default_context().wrap_socket(server, server_hostname=host)
        except OSError as exc:
            _refuse(client, "502 Bad Gateway", f"cannot reach {scheme}://{netloc}: {exc}")
            return
        with server:
            server.sendall(head + rest)
            body_done = _thread.allocate_lock()
            body_done.acquire()
            _thread.start_new_thread(_pump, (client, server, body_done))
            _pump(server, client)  # the answer, then end of file to the relay
            # The relay closes once it has the whole answer: closing first could reset the
            # connection under a request it is still ending (EPIPE there, a lost answer).
            body_done.acquire(timeout=_CLOSE_WAIT_S)
    except OSError:
        pass
    finally:
        client.close()


def _serve(path: str, upstream: tuple[str, str, int], key: bytes, placeholder: bytes) -> None:
    import socket

    try:  # noqa: SIM105
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is 0600 from the start
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    while True:
        client, _ = listener.accept()
        _thread.start_new_thread(_handle, (client, upstream, key, placeholder))


def _parse_upstream(url: str) -> tuple[str, str, int]:
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    host, sep, port = netloc.rpartition(":")
    if not sep or not port.isdigit() or host.endswith(":"):  # no port (or a bare IPv6 address)
        host, port = netloc, "443" if scheme == "https" else "80"
    return scheme, host.strip("[]"), int(port)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(
            "usage: outside.py --socket PATH --upstream URL [--limit NAME=N] -- ARGV",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    socket_path = upstream = ""
    wanted: list[tuple[str, int]] = []
    for name, value in zip(options[::2], options[1::2], strict=True):
        if name == "--socket":
            socket_path = value
        elif name == "--upstream":
            upstream = value
        elif name == "--limit":
            which, _, number = value.partition("=")
            wanted.append((LIMIT_NAMES[which], int(number)))
    env = dict(os.environ)
    key = _read_key(env)
    placeholder = env.pop(PLACEHOLDER_ENV, "").encode()
    limits: list[tuple[int, int]] = []
    if wanted:
        import resource

        limits = [(getattr(resource, name), value) for name, value in wanted]
    pid = _start(command, env, limits)

    # The sandbox is starting: now the forwarder, on the builtins _thread and _signal (the
    # threading and signal modules cost more to import than the rest of this program).
    _signal.signal(_signal.SIGHUP, _signal.SIG_IGN)  # like the keeper: only pi's end ends this
    if socket_path and upstream:
        args = (socket_path, _parse_upstream(upstream), key, placeholder)
        _thread.start_new_thread(_serve, args)
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
