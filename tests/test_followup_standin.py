"""The follow-up view through ``tether context --json`` and a run (the same builder the service
uses): a withheld previous request has a stand-in in its place, a withheld checkpoint is a
withheld gap (docs/contracts.md#the-follow-up-view), and a gap's ``why`` is its true cause: rows
the tail read's row cap
left unread are ``read_cap`` whatever the budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from checkpoint_support import AGENT, config
from followup_sessions import Sketch, assistant, user
from provider import Reply
from tether.config import AccessConfig
from tether.followup import FollowupView, GapWhy, build_view
from tether.followup.build import TAIL_MAX_ROWS
from tether.harness.run import RunRequest, execute_run
from tether.ledger import RowKind, Run, RunStatus, open_ledger

GRANTS = '[access.grants]\n"user:ana" = ["repo:*", "doc:*"]\n"user:bob" = ["repo:*"]\n'


def context(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "tether", "context", "--json", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def write_config(tmp_path: Path, db: Path, budget: int) -> Path:
    config = tmp_path / "tether.toml"
    config.write_text(
        f'[ledger]\nurl = "sqlite://{db}"\n\n[followup]\nbudget_bytes = {budget}\n\n{GRANTS}'
    )
    return config


def text_of(message: dict[str, Any]) -> str:
    return "\n".join(b.get("text", "") for b in message.get("content") or [])


def test_context_json_carries_a_stand_in_for_a_withheld_request(tmp_path: Path) -> None:
    """bob may not read ana's request (doc:secret) nor the checkpoint over secret rows: the view
    is not refused; the request's place holds a stand-in naming row, run and actor; the
    checkpoint's range is one withheld gap; nothing of either reaches the JSON."""
    sk = Sketch("s1")
    sk.add("r1", "user:ana", RowKind.MESSAGE, user("open the vault", ts=1))
    sk.add("r1", "agent:rev", RowKind.MESSAGE, assistant("VAULT-FACT-1", ts=2), ("doc:secret",))
    comp = sk.add(
        "r1",
        "agent:rev",
        RowKind.COMPACTION,
        {"summary": "SUMMARY-OF-VAULT", "covers_to": 2, "continuation": {"version": 1}},
    )
    sk.runs.append(Run("r1", "s1", "rev", RunStatus.FINISHED, request_seq=1))
    req = sk.add(
        "r2", "user:ana", RowKind.MESSAGE, user("SECRET-ASK what is in it?", ts=3), ("doc:secret",)
    )
    answer = sk.add("r2", "agent:rev", RowKind.MESSAGE, assistant("public answer", ts=4))
    sk.runs.append(Run("r2", "s1", "rev", RunStatus.FINISHED, request_seq=req))
    sk.seal()
    db = tmp_path / "ledger.db"
    with open_ledger(f"sqlite://{db}") as ledger:
        ledger.import_records(*sk.records())
    config = write_config(tmp_path, db, 240_000)

    code, bob = context(config, "-s", "s1", "-a", "rev", "--actor", "user:bob")
    assert code == 0, bob
    assert bob["status"] == "ok"
    dumped = json.dumps(bob)
    for secret in ("SECRET-ASK", "VAULT-FACT-1", "SUMMARY-OF-VAULT", "doc:secret"):
        assert secret not in dumped
    assert bob["previous_request"] == {
        "seq": req,
        "run": "r2",
        "actor": "user:ana",
        "mode": "copied",
        "withheld": True,
    }
    assert bob["checkpoint"] is None
    assert bob["gaps"] == [{"from": 1, "to": comp, "why": "withheld"}]
    notice, stand_in, reply = bob["messages"]
    assert notice["synthetic"]
    assert "rows 1–3 of this session" in text_of(notice)
    assert (stand_in["role"], stand_in["origin"], stand_in["synthetic"]) == ("user", None, True)
    assert f"(ledger row {req}, run r2, by user:ana) is withheld" in text_of(stand_in)
    assert (reply["origin"], reply["copied"]) == (answer, True)
    assert bob["sources"] == []

    # ana may read both: the checkpoint quoted, the request itself reused in place.
    code, ana = context(config, "-s", "s1", "-a", "rev", "--actor", "user:ana")
    assert code == 0, ana
    assert ana["previous_request"] == {
        "seq": req,
        "run": "r2",
        "actor": "user:ana",
        "mode": "reused",
    }
    assert ana["checkpoint"]["seq"] == comp
    assert ana["gaps"] == []
    assert [m["origin"] for m in ana["messages"]] == [None, req, answer]


def long_session(rows: int) -> Sketch:
    """One run: a request, then ``rows`` - 1 short replies."""
    sk = Sketch("big")
    sk.add("r1", "user:ana", RowKind.MESSAGE, user("count", ts=1))
    for i in range(rows - 1):
        sk.add("r1", "agent:rev", RowKind.MESSAGE, assistant(f"n{i}", ts=2 + i))
    sk.runs.append(Run("r1", "big", "rev", RunStatus.FINISHED, request_seq=1))
    return sk


@pytest.mark.slow
def test_rows_the_row_cap_left_unread_are_a_read_cap_gap_not_a_budget_one(
    tmp_path: Path,
) -> None:
    """Budget 10^20, 25,000 rows: the tail read stops at its row cap (20,000 rows), so rows 2 up
    to the tail's first are omitted for that cap, not for the budget, and the notice says so."""
    total = 25_000
    db = tmp_path / "ledger.db"
    with open_ledger(f"sqlite://{db}") as ledger:
        ledger.import_records(*long_session(total).records())
        view = build_view(ledger, session="big", agent="rev", actor="user:ana", budget=10**20)
        assert isinstance(view, FollowupView), view
    config = write_config(tmp_path, db, 10**20)
    code, shown = context(config, "-s", "big", "-a", "rev", "--actor", "user:ana")
    assert code == 0, shown
    assert shown == json.loads(json.dumps(view.to_json()))
    first_read = total - TAIL_MAX_ROWS + 1
    assert shown["gaps"] == [{"from": 2, "to": first_read - 1, "why": GapWhy.READ_CAP.value}]
    assert shown["previous_request"]["seq"] == 1
    notices = [m for m in shown["messages"] if m["synthetic"]]
    [notice] = notices
    said = text_of(notice)
    assert f"rows 2–{first_read - 1} of this session" in said
    assert "row limit" in said
    assert "did not fit" not in said
    assert f'recall({{"from":2,"to":{first_read - 1}}})' in said
    origins = [m["origin"] for m in shown["messages"] if not m["synthetic"]]
    assert origins == [1, *range(first_read, total + 1)]

    # Under the row cap, the same rows are whole: no gap at all.
    small = tmp_path / "small.db"
    with open_ledger(f"sqlite://{small}") as ledger:
        ledger.import_records(*long_session(TAIL_MAX_ROWS).records())
        whole = build_view(ledger, session="big", agent="rev", actor="user:ana", budget=10**20)
        assert isinstance(whole, FollowupView), whole
        assert whole.gaps == ()


@pytest.mark.slow
def test_a_run_of_an_actor_not_admitted_to_the_request_starts_from_the_stand_in(
    scripted_provider: Any, tmp_path: Path
) -> None:
    """The same builder feeds a run: bob's run on a session whose previous request only ana may
    read starts (real pi, scripted provider); pi sends the stand-in in the request's place and
    nothing of the request; bob's rows carry none of its sources."""
    provider = scripted_provider([Reply("bob's answer")])
    cfg = config(tmp_path, provider, budget=240_000)
    cfg = cfg.model_copy(
        update={"access": AccessConfig(grants={"user:ana": ["doc:*"], "user:bob": ["repo:*"]})}
    )
    sk = Sketch("s1")
    sk.add("r1", "user:ana", RowKind.MESSAGE, user("an open start", ts=1))
    sk.add("r1", "agent:rev", RowKind.MESSAGE, assistant("started", ts=2))
    sk.runs.append(Run("r1", "s1", AGENT, RunStatus.FINISHED, request_seq=1))
    req = sk.add(
        "r2", "user:ana", RowKind.MESSAGE, user("SECRET-ASK the vault", ts=3), ("doc:secret",)
    )
    sk.add("r2", "agent:rev", RowKind.MESSAGE, assistant("a public reply", ts=4))
    sk.runs.append(Run("r2", "s1", AGENT, RunStatus.FINISHED, request_seq=req))
    workdir = tmp_path / "work"
    workdir.mkdir()
    with open_ledger(cfg.ledger.url) as ledger:
        ledger.import_records(*sk.records())

        async def go() -> Any:
            request = RunRequest(
                session="s1", agent=AGENT, text="And now?", actor="user:bob", workdir=workdir
            )
            return await execute_run(ledger, cfg, request, checkpoint=None)

        outcome = anyio.run(go)
        assert (outcome.status, outcome.answer) == (RunStatus.FINISHED, "bob's answer")
        [sent] = provider.task_requests
        assert not sent.contains("SECRET-ASK")
        assert sent.contains(f"(ledger row {req}, run r2, by user:ana) is withheld")
        assert sent.contains("a public reply")
        assert sent.last_user_text == "And now?"
        view = ledger.get_run(outcome.run).extra["view"]
        assert view["previous_request"]["withheld"] is True
        mine = [r for r in ledger.iter_rows("s1") if r.run == outcome.run]
        assert mine
        assert all("doc:secret" not in r.sources for r in mine)
