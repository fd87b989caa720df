"""``tether context --json`` prints the same bytes on SQLite and on PostgreSQL for the same
sessions, loaded from the same JSONL: the view depends on the ledger's contents, never on its
engine."""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from followup_sessions import RunWriter
from pg import fresh_schema_url
from tether.cli.app import app
from tether.ledger import RunStatus, open_ledger
from tether.ledger.jsonl import dump_session

EXAMPLE = Path(__file__).parent.parent / "src" / "tether" / "examples" / "review.jsonl"
IMAGE = "iVBORw0KGgo" * 40

CONFIG = """
[followup]
budget_bytes = 9000

[access.grants]
"user:ana" = ["repo:acme/*", "doc:handbook"]
"user:bob" = ["repo:acme/*"]
"""

runner = CliRunner()


def write_sessions(url: str) -> None:
    """Sessions that exercise every part of a view: checkpoint, previous request, reuse and
    copies, gaps by budget and by admission, calls without results, media, notes, refusal."""
    with open_ledger(url) as ledger:
        first = RunWriter.start(ledger, "long", "reviewer", run_id="long-r1")
        first.request("Review PR 7 \u2028 carefully ✓")
        first.calls(("c1", "read", {"path": "src/a.py"}))
        first.result("c1", "def a():\n    return 1\n" * 20, sources=("repo:acme/api",))
        first.say("Found one issue in a.py.", sources=("repo:acme/api",))
        first.checkpoint("PR 7: a.py returns a constant; asked for a test.")
        for i in range(40):
            first.calls((f"d{i}", "read", {"path": f"docs/{i}.md"}))
            first.result(f"d{i}", f"handbook page {i} " * 30, sources=("doc:handbook",))
            first.say(f"step {i} done ünïcödé")
        first.calls(("open", "bash", {"cmd": "make test"}))  # never answered
        first.end(RunStatus.FINISHED)

        second = RunWriter.start(ledger, "long", "reviewer", run_id="long-r2")
        second.request("And the image?", actor="user:bob", image=IMAGE)
        second.calls(("c9", "read", {"path": "shot.png"}))
        second.result("c9", "the screenshot", image=IMAGE, sources=("repo:acme/web",))
        second.receipt("truncated")
        second.end(RunStatus.FAILED)

        helper = RunWriter.start(ledger, "long", "helper", run_id="long-r3")
        helper.request("Summarize the secrets", actor="user:eve")
        helper.say("Secret notes", sources=("doc:secret",))
        helper.end(RunStatus.INTERRUPTED)
        ledger.add_note("long", "reviewer", "prefers small PRs", at="2026-11-29T10:00:00Z")
        ledger.add_note("long", "reviewer", "answers in English", at="2026-11-29T10:01:00Z")

        stuck = RunWriter.start(ledger, "stuck", "reviewer", run_id="stuck-r1")
        stuck.request("hello")
        stuck.say("hi")
        stuck.end(RunStatus.FINISHED)
        ledger.set_refusing("stuck", "idle not confirmed")


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    """The sessions as one interchange file (plus the example session)."""
    source = f"sqlite://{tmp_path}/source.db"
    write_sessions(source)
    out = io.StringIO()
    with open_ledger(source) as ledger:
        for sid in ("long", "stuck"):
            dump_session(ledger, sid, out)
    path = tmp_path / "sessions.jsonl"
    path.write_text(out.getvalue() + EXAMPLE.read_text(), encoding="utf-8")
    return path


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema_url() as url:
        yield url


def test_context_json_is_byte_identical_on_sqlite_and_postgres(
    tmp_path: Path, jsonl: Path, pg_url: str
) -> None:
    config = tmp_path / "tether.toml"
    config.write_text(CONFIG)
    urls = [f"sqlite://{tmp_path}/a.db", pg_url]
    for url in urls:
        loaded = runner.invoke(app, ["ledger", "load", str(jsonl), "--ledger", url])
        assert loaded.exit_code == 0, loaded.output

    cases = itertools.product(
        [
            ("long", "reviewer"),
            ("long", "helper"),
            ("long", "nobody"),
            ("stuck", "reviewer"),
            ("review-42", "reviewer"),
        ],
        [None, "user:ana", "user:bob", "user:eve"],
        [None, "2500", "700"],
        [None, "What next?"],
    )
    seen = set()
    views = 0
    for (session, agent), actor, budget, request in cases:
        args = ["context", "--session", session, "--agent", agent, "--json"]
        args += ["--config", str(config)]
        args += ["--actor", actor] if actor else []
        args += ["--budget", budget] if budget else []
        args += ["--request", request] if request else []
        out = [runner.invoke(app, [*args, "--ledger", url]) for url in urls]
        assert out[0].exit_code in (0, 3), out[0].output
        assert (out[1].exit_code, out[1].stdout_bytes) == (out[0].exit_code, out[0].stdout_bytes)
        view = json.loads(out[0].stdout)
        seen.add(view.get("reason", view["status"]))
        seen.update(gap["why"] for gap in view.get("gaps", []))
        views += view["status"] == "ok" and bool(view["gaps"]) and bool(view["checkpoint"])

    # The cases reach the parts of the view that could differ between engines.
    assert {"ok", "session_refusing", "protected_context_over_budget"} <= seen
    assert {"budget", "withheld"} <= seen
    assert views > 0
