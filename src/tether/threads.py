"""Blocking calls from async code: the ledger API is synchronous, the harness and the service
are not.

    rows = await in_thread(ledger.append, fence, rows, request=True)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

__all__ = ["in_thread"]

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, awaited (cancellation waits for it)."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
