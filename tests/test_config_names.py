"""The names of ``[agents.…]`` and ``[providers.…]`` sections are ids: the config refuses the
names ``tether.ids`` refuses, naming the section."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.tier import examples
from tether.config import parse_config
from tether.errors import ConfigError
from tether.ids import MAX_ID_CHARS, id_problem

NAMES = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["", " ", "a\nb", "a\tb", "\u2028", "x" * (MAX_ID_CHARS + 1), "rev", "ré v"]),
)


def _toml(agent: str) -> str:
    # a TOML basic string: every character that is not printable escaped
    inner = "".join(
        ch if ch.isprintable() and ch not in '"\\' else f"\\U{ord(ch):08x}" for ch in agent
    )
    quoted = f'"{inner}"'
    return (
        f'[providers.p]\nbase_url = "http://h/v1"\n[agents.{quoted}]\nprovider = "p"\nmodel = "m"\n'
    )


@settings(max_examples=examples(300, unit=60), deadline=None)
@given(NAMES)
def test_an_agent_name_is_refused_exactly_when_it_is_no_id(name: str) -> None:
    text = _toml(name)
    problem = id_problem(name)
    if problem is None:
        assert name in parse_config(text, Path("t.toml")).agents
    else:
        with pytest.raises(ConfigError) as info:
            parse_config(text, Path("t.toml"))
        assert str(info.value).startswith("t.toml: [agents."), info.value
        assert problem in str(info.value)
