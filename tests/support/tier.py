"""The test tier this run is in, and what a test may make smaller in it.

``make test-fast`` sets ``TETHER_TEST_TIER=unit`` (the inner loop, which must stay short on two
cores); ``make test`` leaves it unset and runs everything at full size. A property test states
both sizes where it states one (``max_examples=examples(300, unit=60)``), so the full run keeps
its full count and the unit tier still runs the same assertions on fewer generated inputs.
"""

from __future__ import annotations

import os

UNIT_TIER = os.environ.get("TETHER_TEST_TIER") == "unit"
"""True in ``make test-fast``: pi and PostgreSQL are unreachable and sizes are the unit ones."""


def examples(full: int, *, unit: int) -> int:
    """Hypothesis ``max_examples``: ``full`` in ``make test``, ``unit`` in the unit tier."""
    if unit > full:
        raise ValueError(f"the unit tier's count ({unit}) must not exceed the full one ({full})")
    return unit if UNIT_TIER else full
