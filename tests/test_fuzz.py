"""Fuzzing the loaders that read what users hand tether: arbitrary bytes and mutated valid files
raise nothing but tether's own errors (and a refused interchange file writes nothing)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from support.tier import examples
from tether.config import Config, parse_config
from tether.errors import ConfigError, InterchangeError
from tether.ledger import open_ledger
from tether.ledger.jsonl import dump_session, load_lines
from tether.pi import jsonl
from tether.pi.client import Closed, RpcClient
from tether.pi.errors import ProtocolError
from tether.pi.jsonl import LineSplitter, decode

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"
GOOD_LINES = EXAMPLE.read_bytes().splitlines()
RECORDS = [json.loads(line) for line in GOOD_LINES]

FUZZ = settings(
    max_examples=examples(300, unit=60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

_BIG = "@@BIG@@"
_DEEP = "@@DEEP@@"
_LONE = "@@LONE@@"
_RAW = {
    f'"{_BIG}"': "9" * 5000,
    f'"{_DEEP}"': "[" * 3000 + "]" * 3000,
    f'"{_LONE}"': '"\\ud800"',
}

# JSON values, including the hostile ones: huge and non-finite numbers, deep nesting, odd text.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.sampled_from(["", "\n", "\x00", "user", "assistant", "text", "toolCall", "r1", "review-42"]),
    # stand-ins for what json.dumps cannot write, spliced into the line as raw text
    st.sampled_from([_BIG, _DEEP, _LONE, float("nan"), float("inf"), 1e23, -1]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _set(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _set(value[path[0]], path[1:], new)
    return value


def _delete(value: Any, path: tuple[Any, ...]) -> None:
    parent = value
    for part in path[:-1]:
        parent = parent[part]
    del parent[path[-1]]


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    records = json.loads(json.dumps(RECORDS))  # a deep copy
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(records) - 1))
        paths = _paths(records[i])
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["set", "delete", "dup", "drop"]))
        if action == "set":
            records[i] = _set(records[i], path, draw(_values))
        elif action == "delete" and path:
            _delete(records[i], path)
        elif action == "dup":
            records.insert(i, json.loads(json.dumps(records[i])))
        elif action == "drop" and len(records) > 1:
            records.pop(i)
    lines = []
    for r in records:
        line = json.dumps(r, allow_nan=True)
        for stand_in, raw in _RAW.items():
            line = line.replace(stand_in, raw)
        lines.append(line.encode())
    if draw(st.booleans()):  # and some raw byte damage
        j = draw(st.integers(0, len(lines) - 1))
        cut = draw(st.integers(0, len(lines[j])))
        lines[j] = lines[j][:cut] + draw(st.binary(max_size=8)) + lines[j][cut:]
    return b"\n".join(lines)


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in a dump is not JSON")

    return json.loads(text, parse_constant=refuse)


def _load_or_refuse(data: bytes) -> None:
    with open_ledger("memory:") as ledger:
        refused: InterchangeError | None = None
        try:
            load_lines(ledger, data, "fuzz.jsonl")
        except InterchangeError as exc:
            refused = exc
        if refused is not None:
            assert refused.line >= 0
            assert "\n" not in str(refused)
            assert ledger.sessions() == []  # refused: nothing written
            return
        # loaded: what loaded dumps as strict JSON, and loads again
        for s in ledger.sessions():
            out = io.StringIO()
            dump_session(ledger, s.id, out)
            for line in out.getvalue().splitlines():
                _strict_json(line)
            with open_ledger("memory:") as again:
                load_lines(again, out.getvalue().encode(), "again")


@FUZZ
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_load_or_are_refused(data: bytes) -> None:
    _load_or_refuse(data)


@FUZZ
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_arbitrary_lines_after_a_session_load_or_are_refused(lines: list[bytes]) -> None:
    _load_or_refuse(b"\n".join([GOOD_LINES[0], *lines]))


@FUZZ
@given(mutated_files())
def test_mutated_files_load_or_are_refused(data: bytes) -> None:
    _load_or_refuse(data)


REFERENCE_TOML = """
[ledger]
url = "memory:"

[followup]
budget_bytes = 240000

[providers.local]
base_url = "http://127.0.0.1:18080/v1"
api = "openai-completions"
api_key_env = "LOCAL_KEY"
context_window = 8192
max_tokens = 1024

[agents.reviewer]
provider = "local"
model = "smollm2"
effort = "off"
system_prompt = "You review code."
tools = ["read", "bash"]
deadline_s = 600

[access.grants]
"user:ana" = ["repo:acme/*"]
"""


def _parse(text: str) -> Config | None:
    try:
        return parse_config(text, Path("fuzz.toml"))
    except ConfigError as exc:
        message = str(exc)
    assert "\n" not in message  # one line
    return None


def test_the_reference_config_parses() -> None:
    cfg = _parse(REFERENCE_TOML)
    assert cfg is not None
    assert cfg.agent("reviewer").provider == "local"


@FUZZ
@given(st.text(max_size=500))
def test_arbitrary_config_text_parses_or_is_refused(text: str) -> None:
    _parse(text)


_toml_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: "nan" if f != f else ("inf" if f == float("inf") else repr(f))
    ),
    st.text(max_size=10).map(json.dumps),
    st.just("[]"),
    st.just('["a", 1]'),
    st.just("{ a = 1 }"),
    st.just("1979-05-27T07:32:00Z"),
)


@FUZZ
@given(st.data())
def test_mutated_configs_parse_or_are_refused(data: st.DataObject) -> None:
    lines = REFERENCE_TOML.splitlines()
    assignments = [i for i, line in enumerate(lines) if " = " in line]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.sampled_from(assignments))
        key = lines[i].split(" = ")[0]
        value = data.draw(_toml_values)
        if isinstance(value, bool):
            value = "true" if value else "false"
        lines[i] = f"{key} = {value}"
    text = "\n".join(lines)
    assume(text != REFERENCE_TOML)
    _parse(text)


# -- pi's RPC line reader ---------------------------------------------------------------------

HOSTILE_LINES = [
    b"[" * 5000 + b"]" * 5000,
    b'{"type":"x","n":' + b"9" * 5000 + b"}",
    b'{"type":"x","s":"\\ud800"}',
    b"\xff\xfe not utf-8",
    b"NaN",
    b'{"type":"x","n":NaN}',
    b"[1, 2]",
    b'{"type": 5}',
    b"",
    b"\r",
]


@FUZZ
@given(
    st.lists(st.one_of(st.binary(max_size=300), st.sampled_from(HOSTILE_LINES)), max_size=8),
    st.integers(1, 64),
)
def test_rpc_framing_and_decoding_raise_only_protocol_errors(
    pieces: list[bytes], chunk: int
) -> None:
    data = b"\n".join(pieces)
    splitter = LineSplitter(max_line=2048)
    lines: list[bytes] = []
    for i in range(0, len(data), chunk):
        # an over-long line is dropped and reported; reading goes on
        with contextlib.suppress(ProtocolError):
            lines += splitter.feed(data[i : i + chunk])
    rest = splitter.flush()
    for line in [*lines, *([rest] if rest else [])]:
        try:
            record = decode(line)
        except ProtocolError:
            continue
        assert isinstance(record, dict)


def _read(decoder: Callable[[bytes], object], line: bytes) -> tuple[str, object]:
    """What reading ``line`` gives: ("record", the object) or ("error", the message)."""
    try:
        value = decoder(line)
    except ProtocolError as exc:
        return "error", str(exc)
    if not isinstance(value, dict):
        return "error", f"a JSON {type(value).__name__}, not an object"
    return "record", value


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(
    st.one_of(
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        JSON_VALUES.map(
            lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")
        ),
        st.binary(max_size=200),
        st.sampled_from(HOSTILE_LINES),
    )
)
def test_a_line_decodes_exactly_as_json_reads_it(line: bytes) -> None:
    # decode() tries msgspec first for speed: what it reads, and how it fails, must be json's.
    fast, slow = _read(decode, line), _read(jsonl._decode_json, line)
    assert fast[0] == slow[0], (fast, slow)
    assert _same(fast[1], slow[1]), (fast, slow)


def _same(a: object, b: object) -> bool:
    """Equal, with NaN equal to itself."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


class _LinesTransport:
    """An AgentTransport that replays fixed stdout lines, then ends."""

    def __init__(self, lines: list[bytes]) -> None:
        self._lines = lines
        self.exit_status: int | None = None

    async def lines(self) -> AsyncIterator[bytes]:
        for line in self._lines:
            await anyio.lowlevel.checkpoint()
            yield line

    async def send(self, data: bytes) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def kill(self) -> None:
        return None

    def diagnostics(self) -> str:
        return ""


@settings(max_examples=examples(60, unit=20), deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=200), st.sampled_from(HOSTILE_LINES)), max_size=8))
def test_the_rpc_client_reads_past_any_line(lines: list[bytes]) -> None:
    """Hostile lines are reported as stray output; the client reads on to the end of the
    stream and closes because the stream ended, not because a line broke it."""
    good = b'{"type":"agent_start"}'

    async def main() -> tuple[list[Any], str | None]:
        seen: list[Any] = []
        async with RpcClient.connect(_LinesTransport([*lines, good])) as client:
            records = client.subscribe()
            async for item in records:
                seen.append(item)
                if isinstance(item, Closed):
                    break
            return seen, client.closed_reason

    seen, reason = anyio.run(main)
    assert reason is not None
    assert reason.startswith("pi closed its output"), reason
    assert {"type": "agent_start"} in [s for s in seen if isinstance(s, dict)]
