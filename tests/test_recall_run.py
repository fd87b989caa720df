"""The recall and note tools in a real run: the real pi (with tether's tools extension) against
the scripted provider, answered by the harness from the ledger, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from followup_sessions import RunWriter
from pg import postgres_url
from provider import Reply, ScriptedProvider, ToolCall
from tether.config import Config
from tether.harness.run import RunOutcome, RunRequest, execute_run
from tether.ledger import Ledger, Row, RunStatus, open_ledger

SECRET = "zebracorn-4417"
FILLER = "the review goes on with ordinary remarks about the diff " * 12


def make_config(
    tmp: Path, url: str, *, budget: int = 6000, tools: list[str] | None = None
) -> Config:
    return Config.model_validate(
        {
            "providers": {"local": {"base_url": url, "context_window": 8192, "max_tokens": 1024}},
            "agents": {
                "rev": {"provider": "local", "model": "scripted", "tools": tools or ["read"]}
            },
            "followup": {"budget_bytes": budget},
            "access": {"grants": {"user:ana": ["repo:*"], "user:bob": ["doc:*"]}},
            "harness": {
                "runs_dir": str(tmp / "runs"),
                "workspaces_dir": str(tmp / "workspaces"),
                "stop_grace_s": 5,
            },
        }
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    url = f"sqlite://{tmp_path}/ledger.db" if request.param == "sqlite" else postgres_url(tmp_path)
    ledger = open_ledger(url)
    yield ledger
    ledger.close()


def seed(ledger: Ledger, *, secret_sources: tuple[str, ...] = ()) -> Row:
    """A finished first run whose early rows do not fit a small budget; one of them (omitted
    from the next view) alone holds SECRET. Returns that row."""
    w = RunWriter.start(ledger, "s1", "rev")
    w.request("Review the deployment change")
    w.say("Starting with the configuration. " + FILLER)
    secret = w.say(
        f"The vault code for staging is {SECRET}; keep it in mind.", sources=secret_sources
    )
    for i in range(12):
        w.say(f"Remark {i}. " + FILLER)
    w.end(RunStatus.FINISHED)
    return secret


def run(
    ledger: Ledger, config: Config, text: str, tmp: Path, *, actor: str = "user:ana"
) -> RunOutcome:
    work = tmp / "work"  # beside the ledger and the run directories, never around them
    work.mkdir(exist_ok=True)
    request = RunRequest(session="s1", agent="rev", text=text, actor=actor, workdir=work)

    async def go() -> RunOutcome:
        return await execute_run(ledger, config, request)

    return anyio.run(go)


def tool_results(p: ScriptedProvider, index: int) -> list[str]:
    """The texts of the tool results the provider's request ``index`` carried."""
    out = []
    for m in p.requests[index].messages:
        if m.get("role") == "tool":
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            out.append(str(content))
    return out


def gap_texts(p: ScriptedProvider, index: int) -> str:
    return "\n".join(p.requests[index].user_texts)


def test_recall_by_query_finds_a_row_the_view_left_out(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    secret = seed(store)
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("recall", {"query": "vault code staging"}, id="c1")]),
            Reply("The staging vault code is on record."),
        ]
    )
    outcome = run(store, make_config(tmp_path, p.url), "What was the vault code?", tmp_path)

    assert outcome.status is RunStatus.FINISHED, outcome.error
    first = p.requests[0]
    assert SECRET not in json.dumps(first.body), "the row is omitted from the view"
    notices = gap_texts(p, 0)
    assert 'recall({"from":' in notices
    tools = [t["function"]["name"] for t in first.body.get("tools", [])]
    assert {"recall", "note"} <= set(tools), "active whatever the agent's tools list holds"
    [result] = tool_results(p, 1)
    assert f"row {secret.seq}" in result
    assert SECRET in result
    assert result.startswith("[tether: quoted evidence")
    assert len(result.encode("utf-8")) <= 16_000


def test_recall_by_range_returns_those_rows_and_the_gap_notice_names_the_call(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    secret = seed(store)
    p = scripted_provider(
        [
            Reply(
                tool_calls=[ToolCall("recall", {"from": secret.seq - 1, "to": secret.seq}, id="c1")]
            ),
            Reply("Read them."),
        ]
    )
    outcome = run(store, make_config(tmp_path, p.url), "Check the early rows", tmp_path)

    assert outcome.status is RunStatus.FINISHED, outcome.error
    run_record = store.get_run(outcome.run)
    gap = run_record.extra["view"]["gaps"][0]
    assert f'recall({{"from":{gap["from"]},"to":{gap["to"]}}})' in gap_texts(p, 0)
    [result] = tool_results(p, 1)
    assert f"row {secret.seq - 1}" in result
    assert f"row {secret.seq} " in result
    assert SECRET in result
    assert "Starting with the configuration." in result
    assert f"row {secret.seq + 1}" not in result


def test_an_actor_without_the_grant_gets_the_withheld_row_named_never_shown(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    secret = seed(store, secret_sources=("repo:acme/vault",))
    p = scripted_provider(
        [
            Reply(
                tool_calls=[
                    ToolCall("recall", {"from": secret.seq - 1, "to": secret.seq + 1}, id="c1"),
                    ToolCall("recall", {"query": "vault"}, id="c2"),
                ]
            ),
            Reply("Some of it is withheld from you."),
        ]
    )
    outcome = run(
        store, make_config(tmp_path, p.url), "What was the vault code?", tmp_path, actor="user:bob"
    )

    assert outcome.status is RunStatus.FINISHED, outcome.error
    ranged, searched = tool_results(p, 1)
    assert f"Withheld: row {secret.seq}." in ranged
    assert f"row {secret.seq - 1} " in ranged
    assert f"row {secret.seq + 1} " in ranged
    assert f"Withheld: row {secret.seq}." in searched
    for text in (ranged, searched, json.dumps(p.requests[1].body)):
        assert SECRET not in text
    # Nothing bob was not admitted to reached him, so his run's rows carry no new source.
    assert all(
        "repo:acme/vault" not in r.sources for r in store.iter_rows("s1") if r.run == outcome.run
    )


def test_the_answer_after_a_recall_carries_the_recalled_rows_sources(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    secret = seed(store, secret_sources=("repo:acme/vault",))
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("recall", {"query": "vault staging"}, id="c1")]),
            Reply(f"The code is {SECRET}."),
        ]
    )
    outcome = run(store, make_config(tmp_path, p.url), "What was the vault code?", tmp_path)

    assert outcome.status is RunStatus.FINISHED, outcome.error
    assert SECRET not in json.dumps(p.requests[0].body)
    [result] = tool_results(p, 1)
    assert SECRET in result
    written = [r for r in store.iter_rows("s1") if r.run == outcome.run]
    answer = next(r for r in reversed(written) if r.role == "assistant")
    assert SECRET in json.dumps(answer.body)
    assert "repo:acme/vault" in answer.sources
    recalled = next(r for r in written if r.role == "toolResult")
    assert "repo:acme/vault" in recalled.sources
    assert secret.sources == ("repo:acme/vault",)
    # bob, who may not read repo:*, is not shown the answer derived from it.
    p2 = scripted_provider([Reply("ok")])
    run(store, make_config(tmp_path, p2.url), "And now?", tmp_path, actor="user:bob")
    assert SECRET not in json.dumps(p2.requests[0].body)


def test_a_note_written_in_one_run_is_in_the_next_runs_view(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    note = "Decided: keep the retry limit at 3; the reviewer corrected me on this."
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("note", {"text": note}, id="c1")]),
            Reply("Noted."),
            Reply("The retry limit stays at 3."),
        ]
    )
    config = make_config(tmp_path, p.url, budget=240_000, tools=["bash"])
    one = run(store, config, "Remember the retry decision", tmp_path)
    assert one.status is RunStatus.FINISHED, one.error
    [saved] = tool_results(p, 1)
    assert saved.startswith("Saved a note")
    [stored] = store.notes("s1", "rev")
    assert (stored.text, stored.actor, stored.run) == (note, "user:ana", one.run)

    two = run(store, config, "What is the retry limit?", tmp_path, actor="user:bob")
    assert two.status is RunStatus.FINISHED, two.error
    texts = gap_texts(p, 2)
    assert f"> {note}" in texts
    assert "working for user:ana" in texts


def test_recall_calls_with_bad_arguments_get_an_error_the_model_can_act_on(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    seed(store)
    p = scripted_provider(
        [
            Reply(
                tool_calls=[
                    ToolCall("recall", {}, id="c1"),
                    ToolCall("note", {"text": "x" * 2001}, id="c2"),
                    # Refused by pi against the tools' JSON Schema, before the harness is asked.
                    ToolCall("recall", {"from": 0}, id="c3"),
                    ToolCall("note", {}, id="c4"),
                ]
            ),
            Reply("I will ask properly."),
        ]
    )
    outcome = run(store, make_config(tmp_path, p.url), "Try the tools", tmp_path)

    assert outcome.status is RunStatus.FINISHED, outcome.error
    bare, long_note, row_zero, no_text = tool_results(p, 1)
    assert 'recall({"query":' in bare
    assert "from: expected >= 1" in row_zero
    assert "text: missing" in no_text
    assert "2000-byte limit" in long_note
    assert store.notes("s1", "rev") == []


def test_the_agents_tools_never_see_the_capability(
    tmp_path: Path, store: Ledger, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    seed(store)
    probe = 'echo "token=[$TETHER_TOOLS_TOKEN] socket=[$TETHER_TOOLS_SOCKET]"'
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": probe}, id="c1")]),
            Reply(tool_calls=[ToolCall("recall", {"query": "vault"}, id="c2")]),
            Reply("Done."),
        ]
    )
    config = make_config(tmp_path, p.url, tools=["bash"])
    outcome = run(store, config, "Look around", tmp_path)

    assert outcome.status is RunStatus.FINISHED, outcome.error
    [shown] = tool_results(p, 1)
    assert "token=[] socket=[]" in shown
    assert SECRET in tool_results(p, 2)[1], "the extension still reaches the harness"
