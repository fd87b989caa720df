"""No answer of the service names a path of the server's filesystem (docs/contracts.md): pi's
system row (its ``cwd``) and a tool's output name the session's workspace, as the ledger keeps
them; the API's rows, the event stream and the pages say ``<workspace>`` instead."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from provider import Reply, ScriptedProvider, ToolCall
from service_support import serve, sse_events, write_config
from tether.ledger import open_ledger
from tether.service.paths import ServerPaths

Provider = Callable[..., ScriptedProvider]


def test_rows_and_events_name_no_server_path(tmp_path: Path, scripted_provider: Provider) -> None:
    p = scripted_provider([Reply(tool_calls=[ToolCall("bash", {"command": "pwd"})]), Reply("ok")])
    server = str(tmp_path.resolve())
    with serve(tmp_path, write_config(tmp_path, p.url)) as s:
        run = s.post("s1", "where are you?").json()["run"]
        assert s.wait_run(run)["status"] == "finished"
        served = s.get("/v1/sessions/s1/rows", after=0).json()["rows"]
        events = [e["data"] for e in sse_events(s.client, run) if e["event"] == "row"]
        page = s.get("/sessions/s1.json")  # the session page's JSON twin: its context
        html = s.get("/sessions/s1")
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        stored = [r.body for r in ledger.iter_rows("s1")]
    # The ledger keeps what pi wrote: the workspace's absolute path, in the system row and in
    # the tool's output (so this test would see a path that leaked).
    assert server in json.dumps(stored)
    for shown in (served, events):
        text = json.dumps(shown, ensure_ascii=False)
        assert server not in text
        [system] = [r for r in shown if r["message"]["role"] == "system"]
        assert system["message"]["sections"]["cwd"] == "<cwd>\n<workspace>/tree\n</cwd>"
        [result] = [r for r in shown if r["message"]["role"] == "toolResult"]
        assert result["message"]["content"][0]["text"].strip() == "<workspace>/tree"
    assert len(events) == len(served)
    assert page.status_code == html.status_code == 200
    assert server not in page.text
    assert server not in html.text
    assert "&lt;workspace&gt;/tree" in html.text  # pi's cwd and the tool's output, as served


def test_a_path_is_rewritten_at_its_boundaries_only() -> None:
    paths = ServerPaths(
        [
            ("<workspace>", Path("/srv/t/workspaces"), True),
            ("<workdir>", Path("/srv/t"), False),
            ("<root>", Path("/"), False),  # would rewrite every path: left out
        ]
    )
    assert paths.text("cd /srv/t/workspaces/s-1a/src && ls") == "cd <workspace>/src && ls"
    assert paths.text("/srv/t/notes.txt, /srv/t") == "<workdir>/notes.txt, <workdir>"
    assert paths.text("/srv/tools/x and /etc/passwd") == "/srv/tools/x and /etc/passwd"
    assert paths.scrub({"a": ["'/srv/t'", 3, None]}) == {"a": ["'<workdir>'", 3, None]}
