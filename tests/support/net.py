"""A listening socket served in a daemon thread, for tests' stand-in servers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

__all__ = ["accept_in_thread"]


def accept_in_thread(sock: socket.socket, take: Callable[[socket.socket], None]) -> None:
    """Accept connections on ``sock`` in a daemon thread, handing each to ``take``, until the
    socket is closed."""

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            take(conn)

    threading.Thread(target=accept, daemon=True).start()
