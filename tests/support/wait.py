"""Waiting for another process: poll a condition (a file, a socket, a row) until a deadline,
never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

__all__ = ["wait_for", "wait_for_async"]

T = TypeVar("T")

POLL_S = 0.02


def wait_for(predicate: Callable[[], T], within: float = 30, what: str = "the condition") -> T:
    """Poll ``predicate`` until it returns something true, and return that; fail the test when
    ``within`` seconds pass first, naming ``what`` was waited for."""
    deadline = time.monotonic() + within
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(POLL_S)
    return value


async def wait_for_async(
    predicate: Callable[[], T], within: float = 30, what: str = "the condition"
) -> T:
    """:func:`wait_for` inside an event loop (it sleeps with anyio between polls)."""
    deadline = time.monotonic() + within
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await anyio.sleep(POLL_S)
    return value
