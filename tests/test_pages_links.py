"""The pages link what they name, in a real headless Chromium (the set-up of tests/test_pages.py):
every seq, range and run id is a link that lands on its row or its run; a checkpoint's anchors
on the timeline; the search box; a run that starts after the page opened; a fork's origin."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from provider import Reply, ToolCall
from service_support import serve, write_config
from test_pages import (
    CHROMIUM,
    CHROMIUM_ARGS,
    SECRET,
    SECRET_IMAGE_TEXT,
    Provider,
    assistant,
    build_long,
    build_others,
    login,
    run_turn,
    shoot,
    tab,
    text,
    user,
)
from tether.ledger import Ledger, NewRow, RowKind, RunStatus, open_ledger
from tether.recall import search

pytestmark = pytest.mark.slow

PLAIN_JS = """(pattern) => {
  // Text that names a row (#12) or a run (r-…) outside a link; quoted content (a message's
  // text, a tool's arguments, raw JSON) is what someone wrote, not the page naming a row.
  const out = [];
  const re = new RegExp(pattern);
  const walk = document.createTreeWalker(document.querySelector('main'), NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const el = walk.currentNode.parentElement;
    if (el.closest('a, .text, .args, .full, pre, details.thinking, summary')) continue;
    if (re.test(walk.currentNode.textContent)) out.push(walk.currentNode.textContent.trim());
  }
  return out;
}"""


def _plain(page: Page) -> list[str]:
    """Seqs and run ids the page names without a link."""
    return page.evaluate(PLAIN_JS, r"#\d+|\br-[0-9a-f]{12}\b")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def site(tmp_path: Path, scripted_provider: Provider) -> Iterator[tuple[str, Ledger]]:
    """tests/test_pages.py's sessions (the long one: 425 rows, checkpoints, withheld rows)."""
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        build_long(ledger)
        build_others(ledger)
    extra = "\n[followup]\nbudget_bytes = 2500\n"
    config = write_config(tmp_path, scripted_provider([]).url, extra=extra)
    with (
        serve(tmp_path, config, workers=0) as s,
        open_ledger(f"sqlite://{tmp_path}/ledger.db") as led,
    ):
        yield s.url, led


def _target(page: Page) -> dict[str, Any] | None:
    return page.evaluate(
        "() => { const t = document.querySelector(':target');"
        " return t && {id: t.id, seq: t.dataset.seq, run: t.dataset.run}; }"
    )


def _follow(page: Page, base: str, link: Any) -> dict[str, Any] | None:
    """Click ``link`` and return the element its fragment targets (once it is there); a link
    without a fragment (a run's) ends on one through its redirect."""
    fragment = urlsplit(link.get_attribute("href")).fragment
    link.click()
    page.wait_for_url(re.compile(f"#{re.escape(fragment) if fragment else '[^#]+'}$"))
    page.locator(f"#{urlsplit(page.url).fragment}").wait_for()
    assert page.url.startswith(base)
    return _target(page)


def test_every_seq_range_and_run_on_the_pages_is_a_link_to_it(browser: Browser, site: Any) -> None:
    base, ledger = site
    last = ledger.last_seq("long")
    with tab(browser) as (page, _seen):
        login(page, base, "ana-token", "/sessions/long")
        assert _plain(page) == []
        # Every row carries its anchor, and its seq links to it.
        ids = page.eval_on_selector_all(
            "#timeline li.row", "ls => ls.map(l => [l.id, +l.dataset.seq])"
        )
        assert ids
        assert all(i == f"row-{seq}" for i, seq in ids)
        hrefs = page.eval_on_selector_all(
            "#timeline li.row .seq a", "as => as.map(a => a.getAttribute('href'))"
        )
        assert hrefs == [f"#row-{seq}" for _, seq in ids]
        # Every run's id links to its place.
        heads = page.eval_on_selector_all(
            "#timeline .run-head",
            "hs => hs.map(h => [h.dataset.run, h.querySelector('strong a').getAttribute('href')])",
        )
        assert heads
        assert all(h == f"/sessions/long/runs/{run}" for run, h in heads)

        # "covers #1–#N": both ends link to their rows; #1 is on another page.
        comp = ledger.latest_compaction("long")
        mark = page.locator(f"#row-{comp.seq} .mark")
        assert [a.inner_text() for a in mark.locator("a").all()] == ["#1", f"#{comp.covers_to}"]
        assert _follow(page, base, mark.locator("a").first) == {
            "id": "row-1",
            "seq": "1",
            "run": None,
        }
        assert "after=0" in page.url
        assert page.locator("#row-1").is_visible()

        # A run's id: to its header, on the page whose first row is the run's first.
        run = ledger.runs("long")[-40]
        page.goto(f"{base}/sessions/long")
        target = _follow(page, base, page.locator(f'.run-head[data-run="{run.id}"] strong a'))
        assert target == {"id": f"run-{run.id}", "seq": None, "run": run.id}
        first = ledger.run_first_seq(run.id)
        assert f"after={first - 1}#run-{run.id}" in page.url
        assert page.eval_on_selector("#timeline li.row", "l => +l.dataset.seq") == first
        assert page.request.get(f"{base}/sessions/long/runs/r-none", max_redirects=0).status == 404
        assert page.request.get(f"{base}/sessions/hidden/runs/{run.id}").status == 403

        # The next view: the checkpoint, its range, the previous request, gaps and origins.
        page.goto(f"{base}/sessions/long/next?agent=rev")
        assert _plain(page) == []
        facts = page.locator(".facts")
        view = page.request.get(f"{base}/sessions/long/next.json?agent=rev").json()
        links = [a.inner_text() for a in facts.locator("a.seq-link").all()]
        gaps = [s for g in view["gaps"] for s in (g["from"], g["to"])]
        expected = [view["checkpoint"]["seq"], 1, view["checkpoint"]["covers_to"]]
        assert links == [f"#{s}" for s in [*expected, view["previous_request"]["seq"], *gaps]]
        prev = view["previous_request"]
        assert facts.locator("a.run-link").last.inner_text() == prev["run"]
        origin = next(m["origin"] for m in view["messages"] if m["origin"] is not None)
        target = _follow(page, base, page.locator("ol.view .seq a").first)
        assert target == {"id": f"row-{origin}", "seq": str(origin), "run": None}
        # The sessions: each newest seq links to its row.
        page.goto(f"{base}/")
        assert page.locator('tr[data-session="long"] td.num a').inner_text() == str(last)
        target = _follow(page, base, page.locator('tr[data-session="long"] td.num a'))
        assert target == {"id": f"row-{last}", "seq": str(last), "run": None}


def test_a_copied_request_says_whose_copy_it_is(browser: Browser, site: Any) -> None:
    """A follow-up view's copy of the previous request (a row with ``extra.origin``) is marked
    and links to the row it copies: it must not read as the user asking again."""
    base, ledger = site
    ledger.ensure_session("copies")
    for extra in ({}, {"origin": 1}):
        fence = ledger.claim_run(ledger.create_run("copies", "rev").id)
        row = NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=user("review it"), extra=extra)
        ledger.append(fence, [row], request=True)
        ledger.end_run(fence, RunStatus.FINISHED)
    with tab(browser) as (page, _seen):
        login(page, base, "ana-token", "/sessions/copies")
        assert page.locator('#row-1 [data-role="copy"]').count() == 0
        mark = page.locator('#row-2 [data-role="copy"]')
        assert mark.inner_text() == "copy of #1"
        assert _follow(page, base, mark.locator("a")) == {"id": "row-1", "seq": "1", "run": None}


def test_a_checkpoints_anchors_are_on_the_timeline_linked_to_their_rows(
    browser: Browser, site: Any, tmp_path: Path
) -> None:
    """The anchors a checkpoint stores (``details.anchors.items``) are listed at its row, each
    with its kind, text and exit, its seq a link to the row it was taken from."""
    base, ledger = site
    ledger.ensure_session("anchored")
    fence = ledger.claim_run(ledger.create_run("anchored", "rev").id)
    ledger.append(fence, [NewRow.message("user:ana", user("run the tests"))], request=True)
    ledger.append(
        fence,
        [NewRow.message("agent:rev", assistant(text(f"step {n}"))) for n in range(2, 6)],
    )
    items = [
        {"seq": 4, "kind": "command", "text": "pytest -q tests/test_api.py", "exit": 1},
        {"seq": 3, "kind": "error", "text": "AssertionError: 409 != 200"},
        {"seq": 2, "kind": "read", "text": "src/api.py"},
    ]
    body = {
        "summary": "ran the tests; one failed",
        "continuation": {"version": 1, "run": fence.run},
        "covers_to": 5,
        "details": {"anchors": {"items": items}},
    }
    ledger.append(fence, [NewRow(actor="agent:rev", kind=RowKind.COMPACTION, body=body)])
    ledger.end_run(fence, RunStatus.FINISHED)
    with tab(browser) as (page, _seen):
        login(page, base, "ana-token", "/sessions/anchored")
        shown = page.locator('#row-6 [data-role="anchors"]')
        assert shown.is_visible()
        shoot(page, tmp_path / "screenshots", "anchors")
        lines = shown.locator("li").all()
        assert [li.get_attribute("data-seq") for li in lines] == ["4", "3", "2"]
        for li, item in zip(lines, items, strict=True):
            got = " ".join(li.inner_text().split())
            assert got.startswith(f"#{item['seq']} {item['kind']}")
            assert str(item["text"]) in got
            assert ("exit 1" in got) == ("exit" in item)
            assert li.locator("a").get_attribute("href") == f"#row-{item['seq']}"
        assert _plain(page) == []
        target = _follow(page, base, lines[1].locator("a"))
        assert target == {"id": "row-3", "seq": "3", "run": None}
        twin = page.request.get(f"{base}/sessions/anchored.json").json()
        row = next(r for g in twin["groups"] for r in g["rows"] if r["seq"] == 6)
        assert row["compaction"]["anchors"] == items
        # The next view quotes them: listed with its checkpoint, linked the same way.
        page.goto(f"{base}/sessions/anchored/next?agent=rev")
        view = page.request.get(f"{base}/sessions/anchored/next.json?agent=rev").json()
        assert view["anchors"]["items"] == items
        quoted = page.locator('.facts [data-role="anchors"] li')
        assert quoted.locator("a").all_inner_texts() == [f"#{a['seq']}" for a in items]
        assert _plain(page) == []
        target = _follow(page, base, quoted.locator("a").first)
        assert target == {"id": "row-4", "seq": "4", "run": None}


def test_the_search_box_finds_rows_as_recall_does_and_links_them(
    browser: Browser, site: Any, tmp_path: Path
) -> None:
    """The session page's search box: recall's search with the logged-in actor's admission
    (the same hits as `tether recall --actor`), each hit a link to its row; matching rows the
    actor may not read are named, never shown."""
    base, ledger = site
    grants = {"user:ana": ["repo:acme/*"], "user:carl": ["repo:acme/*"]}
    with tab(browser) as (page, seen):
        login(page, base, "ana-token", "/sessions/long")
        page.fill('form.search input[name="q"]', "part 42")
        page.press('form.search input[name="q"]', "Enter")
        page.wait_for_url(f"{base}/sessions/long/search?q=part+42")
        recalled = search(ledger, "long", "part 42", actor="user:ana", grants=grants)
        assert recalled.hits
        shown = page.eval_on_selector_all("ol.hits li", "ls => ls.map(l => +l.dataset.seq)")
        assert shown == [h.seq for h in recalled.hits]
        assert page.locator("ol.hits mark").first.inner_text().lower() in ("part", "42")
        shoot(page, tmp_path / "screenshots", "search")
        assert _plain(page) == []
        first = recalled.hits[0].seq
        target = _follow(page, base, page.locator("ol.hits li .seq a").first)
        assert target == {"id": f"row-{first}", "seq": str(first), "run": None}
        assert "42" in page.inner_text(f"#row-{first} .body")

        # Rows outside ana's grants match too: named as recall names them, never shown.
        page.goto(f"{base}/sessions/long/search?q=7f3a")
        recalled = search(ledger, "long", "7f3a", actor="user:ana", grants=grants)
        assert not recalled.hits
        assert recalled.withheld
        assert page.locator("ol.hits li").count() == 0
        named = page.locator('[data-role="withheld"] a').all_inner_texts()
        ends = [(a,) if a == b else (a, b) for a, b in recalled.withheld]
        assert named == [f"#{s}" for pair in ends for s in pair]
        twin = page.request.get(f"{base}/sessions/long/search.json?q=7f3a").json()
        assert twin["withheld"] == recalled.to_json()["withheld"]
        assert twin["hits"] == []
        assert page.request.get(f"{base}/sessions/hidden/search?q=SECRET").status == 403
        assert page.request.get(f"{base}/live/sessions/hidden/events").status == 403
        seen.assert_never(SECRET, SECRET_IMAGE_TEXT)
    with tab(browser) as (page, seen):
        # bob has no grants: every answer (repo:acme/api) is withheld from him.
        login(page, base, "bob-token", "/sessions/long/search?q=fine")
        recalled = search(ledger, "long", "fine", actor="user:bob", grants=grants)
        assert not recalled.hits
        assert recalled.withheld
        assert page.locator("ol.hits li").count() == 0
        assert page.locator('[data-role="withheld"]').is_visible()
        seen.assert_never("is fine", SECRET)
        # A query with no words: recall's own refusal, said on the page.
        page.goto(f"{base}/sessions/long/search?q=%2B%2B")
        assert "no words" in page.inner_text(".error")


def test_a_run_that_starts_after_the_page_opened_appears_without_a_reload(
    browser: Browser, tmp_path: Path, scripted_provider: Provider
) -> None:
    """The session page, opened while nothing runs, learns of each run that starts (the
    session's stream), shows its header, follows its rows to the end; then the next one."""
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        ledger.ensure_session("quiet")
        run_turn(ledger, "quiet", 1)
    p = scripted_provider(
        [
            Reply(tool_calls=[ToolCall("bash", {"command": "echo LATE-TOOL"})], delay_s=1.5),
            Reply("LATE-ANSWER one", delay_s=1.0),
            Reply("LATE-ANSWER two", delay_s=0.5),
        ]
    )
    with serve(tmp_path, write_config(tmp_path, p.url)) as s, tab(browser) as (page, _seen):
        login(page, s.url, "ana-token", "/sessions/quiet")
        assert page.get_attribute("#timeline", "data-live") == ""
        page.evaluate("window.__kept = 'no reload'")
        page.wait_for_timeout(500)  # the session's stream is open
        first = s.post("quiet", "first late request")
        assert first.status_code == 202, first.text
        run = first.json()["run"]
        page.locator(f'.run-head[data-run="{run}"]').wait_for(timeout=30_000)
        page.locator("#timeline", has_text="LATE-ANSWER one").wait_for(timeout=60_000)
        page.locator("#live-state", has_text=f"run {run} ended").wait_for(timeout=30_000)
        assert s.wait_run(run)["status"] == "finished"
        second = s.post("quiet", "second late request")
        assert second.status_code == 202, second.text
        again = second.json()["run"]
        page.locator("#timeline", has_text="LATE-ANSWER two").wait_for(timeout=60_000)
        page.locator("#live-state", has_text=f"run {again} ended").wait_for(timeout=30_000)
        assert page.evaluate("window.__kept") == "no reload"
        with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
            rows = ledger.rows_range("quiet", 1, 1000)
        shown = page.eval_on_selector_all("#timeline li.row", "ls => ls.map(l => +l.dataset.seq)")
        assert shown == [r.seq for r in rows]
        assert "LATE-TOOL" in page.inner_text("#timeline")
        for r in (run, again):
            head = page.locator(f'#timeline .run-head[data-run="{r}"]')
            assert head.locator('[data-role="status"]').inner_text() == "finished"
        assert page.locator("#pending .run-head").count() == 0
        assert _plain(page) == []  # the live state names its run with a link too


def test_a_forks_page_says_what_it_forks_with_links(
    browser: Browser, site: Any, tmp_path: Path
) -> None:
    """A fork names its parent session, the row it forks at and the run that ended there, each
    a link; a session that is no fork says nothing of the kind."""
    base, ledger = site
    run = ledger.runs("short")[0]
    ledger.fork_session("short", run.id, "short-fork")
    fork_seq = ledger.last_seq("short")
    with tab(browser) as (page, _seen):
        login(page, base, "ana-token", "/sessions/short-fork")
        line = page.locator('[data-role="fork"]')
        assert " ".join(line.inner_text().split()).startswith(
            f"A fork of short at #{fork_seq}, the end of run {run.id}"
        )
        assert _plain(page) == []
        shoot(page, tmp_path / "screenshots", "fork")
        twin = page.request.get(f"{base}/sessions/short-fork.json").json()
        assert twin["fork"] == {"parent": "short", "seq": fork_seq, "run": run.id}
        assert line.locator("a").first.get_attribute("href") == "/sessions/short"
        target = _follow(page, base, line.locator("a.seq-link").first)
        assert page.url.startswith(f"{base}/sessions/short?")
        assert target == {"id": f"row-{fork_seq}", "seq": str(fork_seq), "run": None}
        page.goto(f"{base}/sessions/short-fork")
        target = _follow(page, base, line.locator("a.run-link"))
        assert target == {"id": f"run-{run.id}", "seq": None, "run": run.id}
        assert page.url.startswith(f"{base}/sessions/short?")
        assert page.locator('[data-role="fork"]').count() == 0
        assert page.request.get(f"{base}/sessions/short.json").json()["fork"] is None
