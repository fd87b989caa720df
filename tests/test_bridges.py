"""The bridge's parts that need no homeserver: [bridges.matrix] parsing, splitting and rendering
answers, what a thread is told, and how a Matrix event becomes a message."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nio
import pytest
from fastapi import HTTPException

from tether.bridges.core import Inbound, answer_text, refusal_line, session_for, split_text
from tether.bridges.matrix import MatrixAdapter, render_html
from tether.config import MatrixBridgeConfig, parse_config
from tether.errors import ConfigError
from tether.ledger import Run, RunStatus
from tether.ledger.usage import BudgetExhausted, BudgetName

BASE = """
[providers.p]
base_url = "http://127.0.0.1:1/v1"
[agents.rev]
provider = "p"
model = "m"
"""


def _config(section: str) -> MatrixBridgeConfig:
    found = parse_config(BASE + section, Path("t.toml")).bridges.matrix
    assert found is not None
    return found


def test_the_section_parses_and_maps_unlisted_users() -> None:
    m = _config(
        """
[bridges.matrix]
homeserver = "http://127.0.0.1:8008"
user = "@tether:hs"
[bridges.matrix.rooms]
"!abc:hs" = "rev"
"!v12roomid" = "rev"
"#review:hs" = "rev"
[bridges.matrix.actors]
"@ana:hs" = "user:ana"
"""
    )
    assert m.token_env == "TETHER_MATRIX_TOKEN"
    assert m.actor_of("@ana:hs") == "user:ana"
    assert m.actor_of("@bob:hs") == "matrix:@bob:hs"
    assert parse_config(BASE, Path("t.toml")).bridges.matrix is None


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ('user = "tether"', "bridges.matrix.user"),
        ('user = "@t:hs"\nhomeserver = "127.0.0.1:8008"', "bridges.matrix.homeserver"),
        ('user = "@t:hs"\ntoken_env = "MY TOKEN"', "bridges.matrix.token_env"),
        ('user = "@t:hs"\n[bridges.matrix.rooms]\n"review" = "rev"', "bridges.matrix.rooms"),
        ('user = "@t:hs"\n[bridges.matrix.rooms]\n"!a:hs" = "nobody"', "names no [agents.…]"),
        ('user = "@t:hs"\n[bridges.matrix.actors]\n"@a:hs" = ""', "the actor must not be empty"),
        ('user = "@t:hs"\nsplit_chars = 10', "bridges.matrix.split_chars"),
        ('user = "@t:hs"\nroom = "!a:hs"', "unknown key"),
    ],
)
def test_bad_input_is_a_clear_error(section: str, says: str) -> None:
    text = '[bridges.matrix]\nhomeserver = "http://h"\n' + section
    if 'homeserver = "127' in section:
        text = "[bridges.matrix]\n" + section
    with pytest.raises(ConfigError, match=r"t\.toml: ") as got:
        parse_config(BASE + text, Path("t.toml"))
    assert says in str(got.value), got.value


def test_long_answers_split_at_boundaries_and_lose_nothing() -> None:
    paragraphs = [f"para {i} " + "x" * 80 for i in range(10)]
    text = "\n\n".join(paragraphs)
    parts = split_text(text, 200)
    assert all(len(p) <= 200 for p in parts)
    assert "\n\n".join(parts) == text
    assert split_text("short", 200) == ["short"]
    assert split_text("", 200) == [""]
    word = "y" * 450  # no boundary: cut hard
    assert split_text(word, 200) == ["y" * 200, "y" * 200, "y" * 50]


def test_markdown_renders_and_raw_html_is_escaped() -> None:
    html = render_html("**bold** and `code`\n\n<script>alert(1)</script>")
    assert "<strong>bold</strong>" in html
    assert "<code>code</code>" in html
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def _run(status: RunStatus, **extra: object) -> Run:
    return Run(id="r-1", session="s", agent="rev", status=status, extra=dict(extra))


def test_what_a_thread_is_told_when_a_run_ends() -> None:
    assert answer_text(_run(RunStatus.FINISHED, answer="done")) == "done"
    assert "without an answer" in answer_text(_run(RunStatus.FINISHED))
    failed = answer_text(_run(RunStatus.FAILED, error="provider\nsaid no"))
    assert failed == "The run failed: provider said no"
    stopped = answer_text(_run(RunStatus.INTERRUPTED, answer="half", stop_reason="soft_stop"))
    assert stopped == "half\n\n_(stopped: soft_stop)_"
    noted = answer_text(_run(RunStatus.FINISHED, answer="ok", checkpoint="written"))
    assert noted.startswith("ok\n\n_(checkpoint written")
    assert "checkpoint" not in answer_text(
        _run(RunStatus.FINISHED, answer="ok", checkpoint="not_needed")
    )


def test_a_refusal_is_one_line() -> None:
    exc = HTTPException(409, {"status": "refused", "reason": "session_refusing", "detail": "a\nb"})
    assert refusal_line(exc) == "Refused (session_refusing): a b"
    over = BudgetExhausted(
        BudgetName.TOKENS, actor="user:ana", allowed=10, used=12, retry_after_s=5
    )
    assert refusal_line(over).startswith(
        "Refused (budget_exhausted): user:ana's runs used 12 tokens"
    )
    assert refusal_line(HTTPException(422, "x" * 1000)).endswith("…")
    assert len(refusal_line(HTTPException(422, "x" * 1000))) == 400


def test_a_threads_session_id_is_stable_and_per_bridge() -> None:
    one = session_for("matrix:@t:hs", "!r", "$e")
    assert one == session_for("matrix:@t:hs", "!r", "$e")
    assert one.startswith("matrix-")
    assert one != session_for("matrix:@u:hs", "!r", "$e")


def test_a_matrix_event_becomes_a_message() -> None:
    asyncio.run(_event_becomes_a_message())


async def _event_becomes_a_message() -> None:
    config = MatrixBridgeConfig(homeserver="http://h", user="@tether:hs", rooms={"!r": "rev"})
    adapter = MatrixAdapter(config, "token", bridge=None)  # type: ignore[arg-type]
    try:

        def event(content: dict[str, object], sender: str = "@ana:hs") -> object:
            return nio.RoomMessageText.from_dict(
                {
                    "type": "m.room.message",
                    "event_id": "$e1",
                    "sender": sender,
                    "origin_server_ts": 1,
                    "content": {"msgtype": "m.text", **content},
                }
            )

        mention = await adapter.inbound(
            "!r", event({"body": "@tether:hs: look", "m.mentions": {"user_ids": ["@tether:hs"]}})
        )
        assert mention == Inbound("$e1", "!r", None, "@ana:hs", "look", mentions_bot=True)
        thread = {"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}
        follow = await adapter.inbound("!r", event({"body": "and this", **thread}))
        assert follow == Inbound("$e1", "!r", "$root", "@ana:hs", "and this", mentions_bot=False)
        by_name = await adapter.inbound("!r", event({"body": "tether, hi"}))
        assert by_name is not None
        assert by_name.mentions_bot
        assert by_name.text == "hi"
        assert await adapter.inbound("!r", event({"body": "x"}, sender="@tether:hs")) is None
        edit = {"m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}}
        assert await adapter.inbound("!r", event({"body": "* tether: again", **edit})) is None
    finally:
        await adapter.close()
