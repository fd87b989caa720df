"""The pages in a real headless Chromium (Debian's ``chromium``, driven by Playwright): `tether
serve` (uvicorn) on 127.0.0.1 over a real SQLite ledger, a real pi run against the scripted
provider for the live timeline. What each page shows is checked against the ledger (and the
API's JSON); withheld content must never reach the browser, in the page or in any response.
Screenshots of each page at 1280 px and 400 px land in the test's tmp directory."""

from __future__ import annotations

import base64
import contextlib
import struct
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from provider import Reply, ScriptedProvider, ToolCall
from service_support import auth, serve, write_config
from support.browser import browser
from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger

__all__ = ["browser"]  # the fixture (support.browser)

pytestmark = pytest.mark.slow

Provider = Callable[..., ScriptedProvider]

SECRET = "SECRET-7f3a-withheld-from-ana"
SECRET_IMAGE_TEXT = "c2VjcmV0LWltYWdl"  # a base64 payload only a withheld row carries
WIDTHS = (1280, 400)


# -- a session with everything a timeline shows ----------------------------------------------------


def png(width: int = 48, height: int = 32) -> str:
    """A real PNG (a colour gradient), base64: a thumbnail the browser must decode."""
    raw = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (x * 5 % 256, y * 8 % 256, 160))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
    data += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return base64.b64encode(data).decode()


def user(text: str, *images: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "image", "data": i, "mimeType": "image/png"} for i in images]
    return {"role": "user", "content": content, "timestamp": 1}


def assistant(*blocks: dict[str, Any], stop: str = "stop") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": list(blocks),
        "api": "openai-completions",
        "provider": "local",
        "model": "scripted",
        "usage": {
            "input": 1,
            "output": 1,
            "cacheRead": 0,
            "cacheWrite": 0,
            "totalTokens": 2,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
        },
        "stopReason": stop,
        "timestamp": 2,
    }


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_result(call: str, output: str, *, error: bool = False) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call,
        "toolName": "bash",
        "content": [text(output)],
        "isError": error,
        "timestamp": 3,
    }


def run_turn(
    ledger: Ledger,
    session: str,
    n: int,
    *,
    status: RunStatus = RunStatus.FINISHED,
    extra: dict[str, Any] | None = None,
    withheld: bool = False,
    image: str | None = None,
    tail: list[NewRow] | None = None,
) -> str:
    """One run: ana's request, a tool call, its result, the answer (and ``tail`` rows)."""
    run = ledger.create_run(session, "rev", extra={"request": {"actor": "user:ana"}})
    fence = ledger.claim_run(run.id)
    ledger.append(
        fence,
        [
            NewRow.message(
                "user:ana", user(f"request {n}: look at part {n}", *([image] if image else []))
            )
        ],
        request=True,
    )
    call = f"call-{n}"
    rows = [
        NewRow.message(
            "agent:rev",
            assistant(
                {"type": "thinking", "thinking": f"thinking about {n}"},
                {
                    "type": "toolCall",
                    "id": call,
                    "name": "bash",
                    "arguments": {"command": f"cat part{n}.txt"},
                },
                stop="toolUse",
            ),
        ),
        NewRow.message("agent:rev", tool_result(call, f"contents of part {n}\n" * 3)),
    ]
    if withheld:
        rows.append(
            NewRow.message(
                "agent:rev",
                assistant(text(f"{SECRET} in answer {n}")),
                sources=("doc:secret",),
            )
        )
        rows.append(
            NewRow.message(
                "user:ana",
                user("withheld image", SECRET_IMAGE_TEXT),
                sources=("doc:secret",),
            )
        )
    rows.append(
        NewRow.message(
            "agent:rev",
            assistant(text(f"answer {n}: part {n} is fine")),
            sources=("repo:acme/api",),
        )
    )
    ledger.append(fence, rows + (tail or []))
    ledger.end_run(
        fence, status, extra={"answer": f"answer {n}: part {n} is fine", **(extra or {})}
    )
    return run.id


def build_long(ledger: Ledger, turns: int = 100) -> None:
    """About 425 rows: more than two pages; withheld rows, images, a pi compaction, a
    continuation checkpoint, a refusal receipt; finished, failed and interrupted runs."""
    ledger.ensure_session("long")
    image = png()
    for n in range(1, turns + 1):
        kw: dict[str, Any] = {}
        if n == turns:
            # After the last checkpoint: a checkpoint carries the sources of all it covers, so
            # a withheld row before it would withhold the checkpoint too.
            kw["withheld"] = True
        if n % 11 == 0:
            kw["image"] = image
        if n == turns - 20:
            last = ledger.last_seq("long")
            kw["tail"] = [
                NewRow(
                    actor="agent:rev",
                    kind=RowKind.COMPACTION,
                    body={
                        "summary": f"pi's own summary through {last}",
                        "covers_to": last,
                        "tokens_before": 5000,
                    },
                )
            ]
        if n == turns - 5:
            kw["status"] = RunStatus.FAILED
            kw["extra"] = {
                "error": "the provider failed (HTTP 500)",
                "stop_reason": "provider_error",
            }
        if n == turns - 3:
            kw["status"] = RunStatus.INTERRUPTED
            kw["extra"] = {"stop_reason": "deadline"}
        if n == turns - 2:
            refused = {"kind": "continuation_checkpoint_refused", "run": "r-x"}
            refused["reason"] = "truncated"
            kw["tail"] = [NewRow(actor="agent:rev", kind=RowKind.RECEIPT, body=refused)]
        if n == turns - 1:
            last = ledger.last_seq("long") + 5  # the run's own rows before it
            kw["tail"] = [
                NewRow(
                    actor="agent:rev",
                    kind=RowKind.COMPACTION,
                    body={
                        "summary": "continuation summary of everything so far",
                        "continuation": {"version": 1, "run": "r"},
                        "covers_to": last,
                        "tokens_before": 71234,
                    },
                    sources=("repo:acme/api",),
                )
            ]
        run_turn(ledger, "long", n, **kw)
    ledger.add_note("long", "rev", "remember: part 3 needs a second look")


def build_others(ledger: Ledger) -> None:
    ledger.ensure_session("short")
    run_turn(ledger, "short", 1)
    # Opened by a row ana is not admitted to: the session is not hers to see at all.
    ledger.ensure_session("hidden")
    run = ledger.create_run("hidden", "rev")
    fence = ledger.claim_run(run.id)
    ledger.append(
        fence,
        [NewRow.message("user:carl", user(f"{SECRET} hidden"), sources=("doc:secret",))],
        request=True,
    )
    ledger.end_run(fence, RunStatus.FINISHED)
    ledger.ensure_session("queued-one")
    ledger.create_run("queued-one", "rev")


# -- the browser -----------------------------------------------------------------------------------


class Seen:
    """Everything a page received: each response body as it finishes loading, and each message
    of an event stream as Chromium's network layer sees it (CDP: the page's EventSource closes
    its stream at the end, so that response never finishes)."""

    def __init__(self, page: Page) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        self.events: list[tuple[str, str]] = []
        self.urls: list[str] = []
        page.on("requestfinished", self._finished)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.on(
            "Network.eventSourceMessageReceived",
            lambda m: self.events.append((m.get("eventName", ""), m.get("data", ""))),
        )

    def _finished(self, request: Any) -> None:
        response = request.response()
        self.urls.append(request.url)
        if response is not None and not 300 <= response.status < 400:
            self.bodies.append((request.url, response.body()))

    def assert_never(self, *needles: str) -> None:
        assert self.bodies
        for url, body in self.bodies:
            for needle in needles:
                assert needle.encode() not in body, f"{needle!r} reached the browser in {url}"
        for name, data in self.events:
            for needle in needles:
                assert needle not in data, f"{needle!r} reached the browser in a {name} event"


def login(page: Page, base: str, token: str, then: str = "/") -> None:
    page.goto(f"{base}{then}")
    assert page.url.startswith(f"{base}/login"), page.url
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}{then}")


def shoot(page: Page, out: Path, name: str) -> None:
    out.mkdir(exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(100)
        # Nothing may be wider than the viewport (usable at 400 px: no sideways scrolling).
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= width, f"{name} is {scroll} px wide at {width} px"
        page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


@contextlib.contextmanager
def tab(browser: Browser) -> Iterator[tuple[Page, Seen]]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        yield page, Seen(page)
    finally:
        context.close()


@pytest.fixture
def site(tmp_path: Path, scripted_provider: Provider) -> Iterator[tuple[str, Ledger, Path]]:
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        build_long(ledger)
        build_others(ledger)
    extra = "\n[followup]\nbudget_bytes = 2500\n"  # a budget gap and a withheld one
    config = write_config(tmp_path, scripted_provider([]).url, extra=extra)
    with (
        serve(tmp_path, config, workers=0) as s,
        open_ledger(f"sqlite://{tmp_path}/ledger.db") as led,
    ):
        yield s.url, led, tmp_path / "screenshots"


# -- the tests -------------------------------------------------------------------------------------


def test_login_then_the_sessions_the_actor_may_see(browser: Browser, site: Any) -> None:
    base, ledger, shots = site
    with tab(browser) as (page, seen):
        page.goto(f"{base}/")
        assert "/login" in page.url
        page.fill("#token", "not-a-token")
        page.click("button[type=submit]")
        assert "unknown token" in page.inner_text(".error")
        shoot(page, shots, "login")
        cookies = page.context.cookies()
        assert not [c for c in cookies if c["name"] == "tether_token"]
        page.fill("#token", "ana-token")
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        cookie = next(c for c in page.context.cookies() if c["name"] == "tether_token")
        assert cookie["httpOnly"]
        assert cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""  # not readable by scripts

        shown = page.eval_on_selector_all(
            "tr[data-session]", "rs => rs.map(r => r.dataset.session)"
        )
        expected = [s.id for s, _, _ in ledger.session_overview() if s.id != "hidden"]
        assert shown == expected  # newest first, the hidden one left out
        assert shown[0] == "queued-one"
        assert "hidden" not in shown
        for session, last_seq, counts in ledger.session_overview():
            if session.id == "hidden":
                continue
            row = page.locator(f'tr[data-session="{session.id}"]')
            cells = row.locator("td").all_inner_texts()
            assert cells[2] == str(sum(counts.values()))
            assert cells[4] == str(last_seq)
            for status, n in counts.items():
                assert f"{status.value} {n}" in cells[3]
        assert page.locator('tr[data-session="queued-one"] .badge').first.inner_text() == "queued"
        assert page.locator('tr[data-session="long"] .badge').first.inner_text() == "idle"
        shoot(page, shots, "sessions")

        twin = page.request.get(f"{base}/index.json").json()
        assert [s["session"] for s in twin["sessions"]] == shown
        assert twin["actor"] == "user:ana"
        # The hidden session's page is refused like the API refuses it.
        assert page.request.get(f"{base}/sessions/hidden").status == 403
        assert page.request.get(f"{base}/sessions/hidden.json").status == 403
        page.click("form.who button")
        page.wait_for_url(f"{base}/login")
        page.goto(f"{base}/")
        assert "/login" in page.url
        seen.assert_never(SECRET, SECRET_IMAGE_TEXT)


ROWS_JS = """ls => ls.map(l => {
  const t = (sel) => { const e = l.querySelector(sel); return e ? e.innerText : null; };
  return {seq: +l.dataset.seq, cls: l.className, seq_text: t('.seq'), actor: t('.actor'),
          role: t('.role'), bytes: t('.bytes'), body: t('.body'),
          imgs: l.querySelectorAll('img').length};
})"""


def _check_rows(page: Page, ledger: Ledger, first: int, last: int) -> None:
    """Each row on the page against the ledger: seq, actor, role, bytes, text; withheld rows by
    seq only."""
    shown = page.eval_on_selector_all("#timeline li.row", ROWS_JS)
    assert [r["seq"] for r in shown] == list(range(first, last + 1))
    for row, li in zip(ledger.rows_range("long", first, last), shown, strict=True):
        if "doc:secret" in row.sources:
            assert "withheld" in li["cls"].split()
            assert li["actor"] is None
            assert li["role"] is None
            continue
        assert li["seq_text"] == f"#{row.seq}"
        assert li["actor"] == row.actor
        assert li["bytes"].startswith(f"{row.bytes} B")
        body = li["body"]
        if row.kind is RowKind.MESSAGE:
            assert li["role"] == row.role
            for block in row.body["content"]:
                if block["type"] == "text":
                    assert block["text"].strip() in body
                elif block["type"] == "toolCall":
                    assert block["name"] in body
                    assert block["arguments"]["command"] in body
                elif block["type"] == "image":
                    assert li["imgs"] == 1
                    img = page.locator(f'#timeline li.row[data-seq="{row.seq}"] img')
                    img.scroll_into_view_if_needed()  # thumbnails load lazily
                    img.evaluate("i => i.decode()")
                    assert img.evaluate("i => i.naturalWidth") == 48
                    box = img.bounding_box()
                    assert box is not None
                    assert 0 < box["height"] <= 120
        elif row.kind is RowKind.COMPACTION:
            kind = "continuation checkpoint" if row.body.get("continuation") else "pi compaction"
            assert kind in body
            assert f"covers #1–#{row.covers_to}" in body
            assert row.body["summary"] in body
        else:
            assert row.body["kind"] in body
            assert f"reason: {row.body['reason']}" in body


def test_the_timeline_pages_by_seq_and_never_shows_withheld_rows(
    browser: Browser, site: Any
) -> None:
    base, ledger, shots = site
    last = ledger.last_seq("long")
    assert last > 2 * 200  # more than two pages
    with tab(browser) as (page, seen):
        login(page, base, "ana-token", "/sessions/long")
        # The newest page first: the last 200 rows.
        _check_rows(page, ledger, last - 199, last)
        shoot(page, shots, "timeline")
        # Runs with their status, stop reason and duration, as the ledger has them.
        for run in ledger.runs("long")[-8:]:
            head = page.locator(f'#timeline .run-head[data-run="{run.id}"]')
            assert head.locator('[data-role="status"]').inner_text() == run.status.value
            if run.extra.get("stop_reason"):
                assert f"stopped: {run.extra['stop_reason']}" in head.inner_text()
            assert " s" in head.inner_text()
            assert "asked by user:ana" in head.inner_text()
        assert page.locator(".row.compaction").count() >= 1
        assert page.locator(".row.receipt").count() == 1
        # Older: the page before, by seq.
        page.click("a[rel=prev] >> nth=0")
        page.wait_for_url(f"{base}/sessions/long?after={last - 400}")
        _check_rows(page, ledger, last - 399, last - 200)
        shoot(page, shots, "timeline-older")
        page.goto(f"{base}/sessions/long?after=0&limit=50")
        _check_rows(page, ledger, 1, 50)
        tail = last - 30
        twin = page.request.get(f"{base}/sessions/long.json?after={tail}&limit=30").json()
        rows = [r for g in twin["groups"] for r in g["rows"]]
        assert [r["seq"] for r in rows] == list(range(tail + 1, last + 1))
        withheld = [r for r in rows if r["kind"] == "withheld"]
        assert withheld
        assert all(set(r) == {"seq", "kind"} for r in withheld)
        # The API says the same rows are withheld.
        api = page.request.get(
            f"{base}/v1/sessions/long/rows?after={tail}&limit=30", headers=auth("ana-token")
        ).json()
        assert api["withheld"] == [r["seq"] for r in withheld]
        seen.assert_never(SECRET, SECRET_IMAGE_TEXT)
        assert SECRET not in page.content()


def test_the_next_view_shows_the_budget_by_part_and_the_gaps(browser: Browser, site: Any) -> None:
    base, ledger, shots = site
    with tab(browser) as (page, seen):
        login(page, base, "ana-token", "/sessions/long/next?agent=rev")
        api = page.request.get(
            f"{base}/v1/sessions/long/context?agent=rev", headers=auth("ana-token")
        ).json()
        assert api["status"] == "ok"
        expected = {"checkpoint": 0, "previous_request": 0, "notes": 0, "suffix": 0}
        for m in api["messages"]:
            if m.get("customType") == "tether.checkpoint":
                expected["checkpoint"] += m["bytes"]
            elif m.get("customType") == "tether.notes":
                expected["notes"] += m["bytes"]
            elif m["origin"] == api["previous_request"]["seq"]:
                expected["previous_request"] += m["bytes"]
            else:
                expected["suffix"] += m["bytes"]
        expected["free"] = api["budget"] - api["bytes"]
        assert all(expected[p] > 0 for p in ("checkpoint", "previous_request", "notes", "suffix"))
        for part, size in expected.items():
            legend = page.locator(f'.legend li[data-part="{part}"] strong').inner_text()
            assert legend == str(size), part
        # The bar's segments are as wide as their share of the budget.
        bar = page.locator(".bar").bounding_box()
        for part, size in expected.items():
            if part == "free":
                continue
            seg = page.locator(f".bar .seg.{part}").bounding_box()
            assert abs(seg["width"] - bar["width"] * size / api["budget"]) < 3, part
        gaps = page.eval_on_selector_all(".gaps li", "ls => ls.map(l => l.innerText)")
        assert {g["why"] for g in api["gaps"]} == {"budget", "withheld"}
        assert len(gaps) == len(api["gaps"])
        assert api["gaps"]
        for shown, gap in zip(gaps, api["gaps"], strict=True):
            assert shown.startswith(f"#{gap['from']}–#{gap['to']}")
            assert gap["why"] in shown
        assert api["checkpoint"]["seq"] == ledger.latest_compaction("long").seq
        assert f"#{api['checkpoint']['seq']}" in page.inner_text(".facts")
        origins = page.eval_on_selector_all("ol.view li", "ls => ls.map(l => l.dataset.origin)")
        assert origins == ["" if m["origin"] is None else str(m["origin"]) for m in api["messages"]]
        shoot(page, shots, "next")
        twin = page.request.get(f"{base}/sessions/long/next.json?agent=rev").json()
        assert {p["part"]: p["bytes"] for p in twin["parts"]} == expected
        seen.assert_never(SECRET, SECRET_IMAGE_TEXT)


def _duration(run: Any) -> float:
    start = datetime.fromisoformat(run.started.replace("Z", "+00:00"))
    end = datetime.fromisoformat(run.ended.replace("Z", "+00:00"))
    return round((end - start).total_seconds(), 2)


def test_a_running_run_appends_its_rows_live(
    browser: Browser, tmp_path: Path, scripted_provider: Provider
) -> None:
    """ana watches her run append rows (no reload); bob, not admitted to the run's sources, sees
    the same rows arrive withheld, and none of their content reaches his browser."""
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        ledger.ensure_session("live")
        run = ledger.create_run("live", "rev", extra={"request": {"actor": "user:ana"}})
        fence = ledger.claim_run(run.id)
        ledger.append(fence, [NewRow.message("user:ana", user("first request"))], request=True)
        ledger.append(
            fence,
            [
                NewRow.message(
                    "agent:rev",
                    assistant(text("ACME-ONLY first answer")),
                    sources=("repo:acme/api",),
                )
            ],
        )
        ledger.end_run(fence, RunStatus.FINISHED, extra={"answer": "ACME-ONLY first answer"})
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": "echo LIVE-TOOL-OUTPUT"})], delay_s=2.5),
            Reply("LIVE-ANSWER the end", delay_s=2.5),
        ]
    )
    shots = tmp_path / "screenshots"
    with (
        serve(tmp_path, write_config(tmp_path, p.url)) as s,
        tab(browser) as (ana, _),
        tab(browser) as (bob, bob_seen),
    ):
        login(ana, s.url, "ana-token", "/sessions/live")
        login(bob, s.url, "bob-token", "/sessions/live")
        posted = s.post("live", "second request, run it live")
        assert posted.status_code == 202, posted.text
        new_run = posted.json()["run"]
        ana.reload()
        bob.reload()
        assert new_run in (ana.get_attribute("#timeline", "data-live") or "")
        ana.evaluate("window.__kept = 'no reload'")
        bob.evaluate("window.__kept = 'no reload'")
        before = ana.eval_on_selector_all("#timeline li.row", "ls => ls.map(l => +l.dataset.seq)")
        ana.locator("#timeline", has_text="LIVE-ANSWER the end").wait_for(timeout=60_000)
        # A locator, not wait_for_function: that evaluates a string, which the page's CSP
        # (script-src 'self') refuses whenever the first check is not already true.
        ana.locator("#live-state", has_text="ended").wait_for(timeout=30_000)
        done = s.wait_run(new_run)
        assert done["status"] == "finished", done
        assert ana.evaluate("window.__kept") == "no reload"
        with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
            rows = ledger.rows_range("live", 1, 1000)
            done_run = ledger.get_run(new_run)
        after = ana.eval_on_selector_all("#timeline li.row", "ls => ls.map(l => +l.dataset.seq)")
        assert after == [r.seq for r in rows]
        assert len(after) > len(before)
        appended = [r for r in rows if r.seq > max(before)]
        assert any(r.role == "toolResult" for r in appended)
        assert "LIVE-TOOL-OUTPUT" in ana.inner_text("#timeline")
        head = ana.locator(f'.run-head[data-run="{new_run}"]')
        assert head.count() == 1
        assert head.locator('[data-role="status"]').inner_text() == "finished"
        # The header was brought up to date at the end: the run's duration, from the ledger.
        assert f"{_duration(done_run)} s" in head.inner_text()
        counts = ana.eval_on_selector_all(
            '[data-role="last-seq"]', "es => es.map(e => e.innerText)"
        )
        assert counts == [str(rows[-1].seq)] * 2
        shoot(ana, shots, "live")

        bob.locator("#live-state", has_text="ended").wait_for(timeout=30_000)
        assert bob.evaluate("window.__kept") == "no reload"
        bob_seqs = bob.eval_on_selector_all("#timeline li.row", "ls => ls.map(l => +l.dataset.seq)")
        assert bob_seqs == [r.seq for r in rows]
        withheld = bob.eval_on_selector_all(
            "#timeline li.row.withheld", "ls => ls.map(l => +l.dataset.seq)"
        )
        assert withheld == [r.seq for r in rows if r.sources]
        assert any(r.seq > max(before) for r in rows if r.sources)
        # bob may not read the run's answer (GET /v1/runs/{run} is 403 for him): its header
        # shows status and times only, refreshed at the end.
        assert s.get(f"/v1/runs/{new_run}", "bob-token").status_code == 403
        bob_head = bob.locator(f'.run-head[data-run="{new_run}"]').inner_text()
        assert "details withheld" in bob_head
        assert "asked by" not in bob_head
        assert f"{_duration(done_run)} s" in bob_head
        shoot(bob, shots, "live-withheld")
        html = bob.content()
        for needle in ("LIVE-ANSWER", "LIVE-TOOL-OUTPUT", "ACME-ONLY"):
            assert needle not in html
        bob_seen.assert_never("LIVE-ANSWER", "LIVE-TOOL-OUTPUT", "ACME-ONLY")
        assert [n for n, _ in bob_seen.events if n == "row"], "bob's page followed no stream"
