"""The canonical JSON of docs/contracts.md#byte-accounting is the stdlib's bytes (sorted keys, no
spaces, non-ASCII kept):
the faster encoder behind :func:`tether.sizes.canonical_json` must write exactly those."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from support.tier import examples
from tether.sizes import _msgspec_agrees, canonical_json

_STDLIB = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


def _stdlib(value: Any) -> str:
    return _STDLIB(value)


@settings(max_examples=examples(2000, unit=200), deadline=None)
@given(JSON)
@example(1e16)
@example(1.5e-7)
@example(0.00001)
@example(-0.000012)
@example(5e-324)
@example(1.7976931348623157e308)
@example(math.nan)
@example(-math.inf)
@example({"cost": [0.0000123, 1e-4, 9.99e15, 1e16]})
@example({"\x7f\u2028\x00\x1f": "\ud7ff\ue000\U0001f600", "é": 1, "z": 2, "": 3})
@example(2**64)
def test_canonical_json_is_the_stdlibs(value: Any) -> None:
    assert canonical_json(value) == _stdlib(value)


@settings(max_examples=examples(300, unit=60), deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_every_float_msgspec_writes_otherwise_is_caught(x: float) -> None:
    """The guard, not the luck of the draw above: for any float where msgspec's bytes differ,
    the guard sends the value to the stdlib, alone or inside a container."""
    for value in (x, [x], {"k": x}, [1, x]):
        out = msgspec.json.encode(value, order="sorted")
        if out.decode() != _stdlib(value):
            assert not _msgspec_agrees(out), value


def test_ordinary_messages_take_the_fast_path() -> None:
    """A pi message without exponents or nulls is not sent to the stdlib (else the speed is
    gone without a test failing)."""
    msg = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "reading ünïcode 😀"},
            {"type": "toolCall", "id": "toolu_01ABC", "name": "read", "arguments": {"p": "a"}},
        ],
        "usage": {"input": 1200, "output": 40, "cost": {"input": 0.0036, "total": 0.00425}},
        "stopReason": "toolUse",
        "timestamp": 1764410400123,
    }
    out = msgspec.json.encode(msg, order="sorted")
    assert _msgspec_agrees(out)
    assert canonical_json(msg) == out.decode() == _stdlib(msg)


def test_what_msgspec_refuses_gets_the_stdlibs_answer() -> None:
    assert canonical_json({10: 1, 9: 2}) == '{"9":2,"10":1}'  # int keys: sorted as ints
    assert canonical_json("\ud800") == '"\ud800"'  # a lone surrogate: kept as the stdlib does
