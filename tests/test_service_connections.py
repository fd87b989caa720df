"""A serve process bounds what idle and half-sent connections cost it: a request head must arrive
within ``[service] head_timeout_s`` of the connection (or of the answer before it), and no more
than ``[service] max_connections`` are held open, so that a flood of half-sent heads cannot use
up its open files (the usual limit is 1,024) and it keeps answering."""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service_support import Served, serve, write_config

pytestmark = pytest.mark.slow

HALF = b"GET / HTTP/1.1\r\nHost: x\r\n"  # a request head with no end
NOFILE = 1024


def _serve_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@contextlib.contextmanager
def _own_limit(wanted: int) -> Iterator[None]:
    """Raise this process's open-files limit (it holds the flood's sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"the test needs {wanted} open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _half_heads(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    out = []
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(True)
        sock.settimeout(5)
        try:
            sock.connect((host, int(port)))
            sock.sendall(HALF)
        except OSError:
            sock.close()  # refused or reset at once: dropped, which is what is asked
            continue
        sock.setblocking(False)
        out.append(sock)
    return out


def _closed(sock: socket.socket) -> bool:
    """The server closed it (EOF or reset); it may have said 408 first."""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _wait_dropped(socks: list[socket.socket], within: float) -> list[socket.socket]:
    """Wait up to ``within`` seconds for the server to close every socket; those still open."""
    sel = selectors.DefaultSelector()
    open_ = set()
    for sock in socks:
        if _closed(sock):
            sock.close()
        else:
            sel.register(sock, selectors.EVENT_READ)
            open_.add(sock)
    deadline = time.monotonic() + within
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if _closed(sock):
                sel.unregister(sock)
                open_.discard(sock)
                sock.close()
    sel.close()
    return list(open_)


def _healthy(s: Served) -> bool:
    with httpx.Client(base_url=s.url, timeout=5) as client:
        try:
            return client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False


def test_1500_half_sent_heads_are_dropped_and_healthz_keeps_answering(tmp_path: Path) -> None:
    # The defaults: a head within 10 s, at most 512 connections.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    with _own_limit(4096), serve(tmp_path, config, workers=1, preexec=_serve_limit) as s:
        pid = s.proc.pid
        before = _open_files(pid)
        socks = _half_heads(s.url, 1500)
        try:
            # While they hang, the service answers (each check a new connection).
            assert all(_healthy(s) for _ in range(5)), s.output()[-2000:]
            assert _open_files(pid) < NOFILE - 64, "the flood's connections use up its files"
            left = _wait_dropped(socks, within=10 + 5)
            assert not left, f"{len(left)} half-sent heads still open after 15 s"
        finally:
            for sock in socks:
                sock.close()
        assert _healthy(s)
        assert _open_files(pid) <= before + 8
        assert s.proc.poll() is None


def test_a_head_must_arrive_within_the_bound_after_the_connection_or_the_last_answer(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", extra="head_timeout_s = 2")
    with serve(tmp_path, config, workers=0) as s:
        started = time.monotonic()
        [half] = _half_heads(s.url, 1)
        idle = socket.create_connection(_addr(s))  # sends nothing at all
        # A keep-alive connection that was answered once and then sends half a head.
        again = socket.create_connection(_addr(s))
        again.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in again.recv(4096)
        again.sendall(HALF)
        again.setblocking(False)
        idle.setblocking(False)
        time.sleep(1)
        assert not any(_closed(x) for x in (half, idle, again)), "dropped before the bound"
        left = _wait_dropped([half, idle, again], within=4)
        assert not left
        assert time.monotonic() - started < 2 + 4
        # A head that arrives in time is answered.
        assert _healthy(s)


def _addr(s: Served) -> tuple[str, int]:
    host, port = s.url.removeprefix("http://").split(":")
    return host, int(port)
