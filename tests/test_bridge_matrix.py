"""``tether bridge matrix`` end to end (docs/bridges.md): a real Synapse on 127.0.0.1
(tests/support/synapse.py), the bridge as users run it (a subprocess with one in-process
worker), real pi, the scripted provider. People post with plain client-server API calls and
read the threads back from the homeserver."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provider import RecordedRequest, Reply, ScriptedProvider, ToolCall, route
from service_support import stop_proc, tether_proc, wait_until, write_config
from support.synapse import MatrixUser, People, bridge_toml
from test_service_images import png
from tether.bridges.matrix import ENCRYPTED_NOTICE
from tether.ledger import Ledger, RunStatus, open_ledger

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("matrix")]

Provider = Callable[..., ScriptedProvider]


def _answer(req: RecordedRequest) -> Reply:
    return Reply(f"**answer** to: {req.last_user_text}")


@dataclass
class Bridged:
    tmp: Path
    config: Path
    people: People
    provider: ScriptedProvider
    bot: MatrixUser
    ledger_url: str
    label: str = "bridge"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def name(self) -> str:
        return f"matrix:{self.bot.user_id}"

    def start(self, *, wait: bool = True) -> None:
        self.starts += 1
        self.proc = tether_proc(
            self.tmp,
            "bridge",
            "matrix",
            "--config",
            str(self.config),
            "--workers",
            "1",
            log=f"{self.label}-{self.starts}.log",
            env={"TEST_MATRIX_TOKEN": self.bot.token},
        )
        proc = self.proc

        def synced() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the bridge exited:\n{self.output()}")
            return self.ledger_call(lambda led: led.bridge_cursor(self.name)) is not None

        if wait:
            wait_until(synced, "the bridge's first sync", 60)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if sig == signal.SIGKILL:  # the bridge only: pi stays with its keeper
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        else:
            stop_proc(self.proc)
        self.proc = None

    def output(self) -> str:
        return "\n".join(
            (self.tmp / f"{self.label}-{i}.log").read_text(errors="replace")[-3000:]
            for i in range(1, self.starts + 1)
        )

    def latest_output(self) -> str:
        """The log of the process started last."""
        return (self.tmp / f"{self.label}-{self.starts}.log").read_text(errors="replace")

    def ledger_call(self, fn: Callable[[Ledger], Any]) -> Any:
        with open_ledger(self.ledger_url) as led:
            return fn(led)

    def bot_posts(self, room: str, root: str) -> list[dict[str, Any]]:
        """The bot's events in the thread, oldest first."""
        thread = self.people.ana.thread(room, root)
        return [e for e in thread if e["sender"] == self.bot.user_id]

    def wait_posts(self, room: str, root: str, n: int, within: float = 60) -> list[dict[str, Any]]:
        try:
            wait_until(lambda: len(self.bot_posts(room, root)) >= n, f"{n} bot post(s)", within)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.output()}") from None
        return self.bot_posts(room, root)


@pytest.fixture
def bridged(
    tmp_path: Path, people: People, scripted_provider: Provider
) -> Iterator[Callable[..., Bridged]]:
    made: list[Bridged] = []

    def make(
        rooms: list[str],
        script: Any = _answer,
        extra: str = "",
        tail: str = "",
        bot: MatrixUser | None = None,
        images: bool = False,
        ledger_url: str | None = None,
        label: str = "bridge",
        lease_s: float = 30,
        start: bool = True,
    ) -> Bridged:
        bot = bot or people.bot
        p = scripted_provider(script)
        ledger_url = ledger_url or f"sqlite://{tmp_path}/ledger.db"
        config = write_config(tmp_path, p.url, ledger_url=ledger_url, lease_s=lease_s)
        if images:
            text = config.read_text().replace(
                "deadline_s = 60\n", "deadline_s = 60\nimages = true\n"
            )
            config.write_text(text)
        settings = f"poll_s = 0.1\nretry_s = 0.2\nsync_timeout_s = 1\n{extra}"
        with config.open("a") as f:
            f.write(
                bridge_toml(people.hs, bot, rooms, token_env="TEST_MATRIX_TOKEN", settings=settings)
            )
            f.write(f'\n[bridges.matrix.actors]\n"{people.ana.user_id}" = "user:ana"\n{tail}\n')
        b = Bridged(tmp_path, config, people, p, bot, ledger_url, label)
        made.append(b)
        if start:
            b.start()
        return b

    yield make
    for b in made:
        b.stop()


def _room(people: People, bot: MatrixUser | None = None, **kw: Any) -> str:
    bot = bot or people.bot
    room = people.ana.create_room(invite=[bot.user_id, people.bob.user_id], **kw)
    people.bob.join(room)
    return room


def test_a_mention_starts_a_thread_whose_follow_ups_share_its_session(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    unbound = _room(people)
    people.bot.join(unbound)
    b = bridged([room])
    root = people.ana.send(room, "what does `kv` hold?", mention=people.bot)
    people.ana.send(unbound, "ignore me, no agent here", mention=people.bot)

    [first] = b.wait_posts(room, root, 1)
    content = first["content"]
    assert content["m.relates_to"]["rel_type"] == "m.thread"
    assert content["m.relates_to"]["event_id"] == root
    assert content["msgtype"] == "m.text"
    assert content["body"] == "**answer** to: what does `kv` hold?"
    assert content["format"] == "org.matrix.custom.html"
    assert "<strong>answer</strong>" in content["formatted_body"]
    assert "<code>kv</code>" in content["formatted_body"]

    # a follow-up in the thread (no mention), from bob (unmapped: matrix:<user id>)
    follow = people.bob.send(room, "and what about the cache?", thread=root)
    posts = b.wait_posts(room, root, 2)
    assert posts[1]["content"]["body"] == "**answer** to: and what about the cache?"

    session, agent = b.ledger_call(lambda led: led.thread_of(b.name, room, root))
    assert agent == "rev"
    runs = b.ledger_call(lambda led: led.runs(session))
    assert len(runs) == 2
    by_event = {r.extra["request"]["request_id"]: r for r in runs}
    assert set(by_event) == {
        f'["user:ana","{root}"]',
        f'["matrix:{people.bob.user_id}","{follow}"]',
    }
    assert {r.extra["request"]["actor"] for r in runs} == {
        "user:ana",
        f"matrix:{people.bob.user_id}",
    }
    # the follow-up's run was given the previous request, in the same session
    asked = [r for r in b.provider.requests if not r.is_summary]
    assert asked[-1].last_user_text == "and what about the cache?"
    assert asked[-1].contains("what does `kv` hold?"), "the previous request is in the view"
    # the unbound room: no thread, no run, no post
    assert b.ledger_call(lambda led: led.thread_of(b.name, unbound, root)) is None
    assert all(e["sender"] != people.bot.user_id for e in people.ana.messages(unbound))

    # status, in the thread: a notice, no run
    people.ana.send(room, "status", thread=root)
    posts = b.wait_posts(room, root, 3)
    assert posts[2]["content"]["msgtype"] == "m.notice"
    assert posts[2]["content"]["body"].startswith("Idle: no run is live; 0 queued.")
    assert len(b.ledger_call(lambda led: led.runs(session))) == 2


def test_a_restart_replays_nothing_and_a_redelivered_event_runs_once(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    b = bridged([room])
    first_cursor = b.ledger_call(lambda led: led.bridge_cursor(b.name))
    root = people.ana.send(room, "count me once", mention=people.bot)
    b.wait_posts(room, root, 1)
    session, _ = b.ledger_call(lambda led: led.thread_of(b.name, room, root))

    b.stop()
    b.start()  # from the stored token: nothing again
    time.sleep(3)
    assert len(b.bot_posts(room, root)) == 1
    assert len(b.ledger_call(lambda led: led.runs(session))) == 1

    # the homeserver delivers the event again (the position before it): still one run, one answer
    b.stop()
    b.ledger_call(lambda led: led.set_bridge_cursor(b.name, first_cursor))
    b.start()
    wait_until(
        lambda: b.ledger_call(lambda led: led.bridge_cursor(b.name)) != first_cursor,
        "the sync past the redelivered event",
        30,
    )
    time.sleep(3)
    assert len(b.bot_posts(room, root)) == 1, b.output()
    assert len(b.ledger_call(lambda led: led.runs(session))) == 1


def test_a_post_retried_after_a_crash_is_the_same_event(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    b = bridged([room])
    root = people.ana.send(room, "answer me once", mention=people.bot)
    [posted] = b.wait_posts(room, root, 1)
    b.stop()
    # As if the bridge had died after the homeserver took the post but before the ledger heard:
    # the row is pending again, nothing sent, its lease lapsed.
    with sqlite3.connect(b.tmp / "ledger.db") as db:
        changed = db.execute(
            "UPDATE bridge_outbox SET state = 'pending', parts_sent = 0, due = 0, done_at = NULL"
        ).rowcount
    assert changed == 1
    b.start()
    wait_until(
        lambda: b.ledger_call(lambda led: led.bridge_messages(b.name))[0].state == "sent",
        "the retried post",
        30,
    )
    [again] = b.ledger_call(lambda led: led.bridge_messages(b.name))
    assert again.attempts == 2
    assert [e["event_id"] for e in b.bot_posts(room, root)] == [posted["event_id"]]


def test_an_answer_ready_while_the_homeserver_is_down_is_posted_once_it_is_back(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)

    def slow(req: RecordedRequest) -> Reply:
        return Reply(f"late answer to: {req.last_user_text}", delay_s=4)

    b = bridged([room], script=slow)
    root = people.ana.send(room, "take your time", mention=people.bot)
    wait_until(
        lambda: b.ledger_call(lambda led: led.event_run(b.name, root)) is not None,
        "the request queued",
        30,
    )
    run_id = b.ledger_call(lambda led: led.event_run(b.name, root))
    people.hs.stop_process()
    try:
        wait_until(
            lambda: b.ledger_call(lambda led: led.get_run(run_id)).status is RunStatus.FINISHED,
            "the run's end",
            60,
        )
        wait_until(
            lambda: any(
                m.attempts >= 2 for m in b.ledger_call(lambda led: led.bridge_messages(b.name))
            ),
            "failed attempts while the homeserver is down",
            30,
        )
    finally:
        people.hs.restart()
    posts = b.wait_posts(room, root, 1)
    time.sleep(2)
    posts = b.bot_posts(room, root)
    assert [p["content"]["body"] for p in posts] == ["late answer to: take your time"]
    [message] = b.ledger_call(lambda led: led.bridge_messages(b.name))
    assert message.state == "sent"
    assert message.attempts >= 2


def test_stop_in_the_thread_stops_its_live_run(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)

    def stalls(req: RecordedRequest) -> Reply:
        return Reply("too late", delay_s=60)

    b = bridged([room], script=stalls)
    root = people.ana.send(room, "a long job", mention=people.bot)
    b.provider.wait_for_requests(1, timeout=60)  # pi waits for the (stalled) reply
    # a live run shows as the bot typing
    wait_until(lambda: people.bot.user_id in people.ana.typing_in(room), "the bot typing", 20)
    people.ana.send(room, "stop", thread=root)
    posts = b.wait_posts(room, root, 2)
    bodies = [p["content"]["body"] for p in posts]
    assert bodies[0].startswith("Stopping run r-"), bodies
    assert posts[0]["content"]["msgtype"] == "m.notice"
    assert "_(stopped:" in bodies[1], bodies
    run_id = b.ledger_call(lambda led: led.event_run(b.name, root))
    run = b.ledger_call(lambda led: led.get_run(run_id))
    assert run.status is RunStatus.INTERRUPTED
    wait_until(lambda: people.bot.user_id not in people.ana.typing_in(room), "typing ended", 20)


def test_an_encrypted_room_is_refused_with_a_message(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people, encrypted=True)
    b = bridged([room])
    wait_until(
        lambda: any(
            e["sender"] == people.bot.user_id and e["content"].get("body") == ENCRYPTED_NOTICE
            for e in people.ana.messages(room)
        ),
        "the encrypted room's notice",
        30,
    )
    assert b.ledger_call(lambda led: led.bridge_messages(b.name))[0].key == f"encrypted:{room}"


def test_a_message_sent_while_the_run_is_live_goes_into_that_run(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)

    def script(req: RecordedRequest) -> Reply:
        if req.last_user_text == "the first thing":
            return Reply("working on the first thing", delay_s=8)
        return Reply(f"answer to: {req.last_user_text}")

    b = bridged([room], script=script)
    root = people.ana.send(room, "the first thing", mention=people.bot)
    b.provider.wait_for_requests(1, timeout=60)  # the turn is live: pi waits for the reply
    follow = people.ana.send(room, "and the second thing", thread=root)
    [answer] = b.wait_posts(room, root, 1)
    time.sleep(3)  # nothing more comes: the delivered request has no answer of its own
    assert [p["content"]["body"] for p in b.bot_posts(room, root)] == [answer["content"]["body"]]
    assert answer["content"]["body"] == "answer to: and the second thing"
    first = b.ledger_call(lambda led: led.event_run(b.name, root))
    delivered = b.ledger_call(lambda led: led.get_run(led.event_run(b.name, follow)))
    assert delivered.extra["delivered_into"] == first
    assert delivered.extra["deliver"] == "follow_up"
    assert [r.last_user_text for r in b.provider.requests if not r.is_summary] == [
        "the first thing",
        "and the second thing",
    ]


def test_a_refused_request_is_explained_in_one_line(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    b = bridged([room], tail="[followup]\nrequest_max_bytes = 40\n")
    root = people.ana.send(room, "please " * 20, mention=people.bot)
    [notice] = b.wait_posts(room, root, 1)
    body = notice["content"]["body"]
    assert notice["content"]["msgtype"] == "m.notice"
    assert body.startswith(
        "Refused (request_too_large): the request is 139 bytes, over the limit of 40 bytes"
    ), body
    assert "\n" not in body, body
    session, _ = b.ledger_call(lambda led: led.thread_of(b.name, room, root))
    assert b.ledger_call(lambda led: led.runs(session)) == []


def test_m_limit_exceeded_is_waited_out_and_every_part_posted_once(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    slow = people.hs.register("slowbot")
    people.hs.limit(slow, per_second=1, burst=1)
    room = _room(people, bot=slow)
    paragraphs = [f"part {i}: " + "word " * 40 for i in range(5)]

    def long(req: RecordedRequest) -> Reply:
        return Reply("\n\n".join(paragraphs))

    b = bridged([room], script=long, extra="split_chars = 250", bot=slow)
    root = people.ana.send(room, "a long answer please", mention=slow)
    posts = b.wait_posts(room, root, 5, within=90)
    time.sleep(2)
    posts = b.bot_posts(room, root)
    assert [p["content"]["body"] for p in posts] == [p.strip() for p in paragraphs]
    [message] = b.ledger_call(lambda led: led.bridge_messages(b.name))
    assert message.state == "sent"
    assert message.attempts >= 2, "a post was refused with M_LIMIT_EXCEEDED and retried"
    assert "rate limited posting" in b.output()


def test_an_image_in_the_thread_becomes_the_requests_attachment(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    b = bridged([room], images=True)
    picture = png()
    root = people.ana.send_image(room, picture, "image/png", mention=people.bot)
    [answer] = b.wait_posts(room, root, 1)
    assert answer["content"]["body"] == "**answer** to: (an image: picture.png)"
    [task] = [r for r in b.provider.requests if not r.is_summary]
    urls = [
        part["image_url"]["url"]
        for message in task.body["messages"]
        if message.get("role") == "user" and isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]
    assert urls == ["data:image/png;base64," + base64.b64encode(picture).decode()]
    run = b.ledger_call(lambda led: led.get_run(led.event_run(b.name, root)))
    assert [i["mimeType"] for i in run.extra["images"]] == ["image/png"]


def test_a_restart_after_a_long_absence_misses_nothing(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    b = bridged([room])
    b.stop()
    # More than one sync batch holds (50 a room): the homeserver answers with a limited
    # timeline, and the bridge reads back the rest to its stored position.
    root = people.ana.send(room, "asked while the bridge was away", mention=people.bot)
    for i in range(60):
        people.bob.send(room, f"chatter {i}")
    b.start()
    [answer] = b.wait_posts(room, root, 1)
    assert answer["content"]["body"] == "**answer** to: asked while the bridge was away"
    assert "missed while away" in b.latest_output(), "the timeline was limited and read back"


def test_a_checkpoint_is_noted_and_the_next_answer_builds_on_it(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    mark = "SUMMARY-MARK-bridge"
    script = route(
        task=[
            Reply(tool_calls=[ToolCall("bash", {"command": "seq 1 3000"})]),
            Reply("first answer"),
            Reply("second answer"),
        ],
        summary=[Reply(f"## Goal\n{mark}"), Reply("## Goal\nthe next run's")],
    )
    b = bridged([room], script=script, tail="[followup]\nbudget_bytes = 4000\n")
    root = people.ana.send(room, "start the long job", mention=people.bot)
    [first] = b.wait_posts(room, root, 1, within=90)
    assert first["content"]["body"] == (
        "first answer\n\n_(checkpoint written: later answers build on its summary)_"
    )
    assert "<em>(checkpoint written" in first["content"]["formatted_body"]
    people.ana.send(room, "and what next?", thread=root)
    posts = b.wait_posts(room, root, 2, within=90)
    assert posts[1]["content"]["body"].startswith("second answer")
    nxt = b.provider.task_requests[-1]
    assert nxt.last_user_text == "and what next?"
    assert nxt.contains(mark), "the checkpoint is in the next run's view"


def test_a_bridge_killed_mid_run_and_restarted_answers_once(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)

    def slow(req: RecordedRequest) -> Reply:
        time.sleep(4)  # the bridge is killed while pi waits for this
        return Reply(f"answer to: {req.last_user_text}")

    b = bridged([room], script=slow, lease_s=3)
    root = people.ana.send(room, "survive a crash", mention=people.bot)
    b.provider.wait_for_requests(1, timeout=60)
    b.stop(signal.SIGKILL)
    run_id = b.ledger_call(lambda led: led.event_run(b.name, root))
    assert b.ledger_call(lambda led: led.get_run(run_id)).status is RunStatus.RUNNING
    b.start()
    b.wait_posts(room, root, 1, within=90)
    time.sleep(3)
    assert [p["content"]["body"] for p in b.bot_posts(room, root)] == ["answer to: survive a crash"]
    run = b.ledger_call(lambda led: led.get_run(run_id))
    assert run.status is RunStatus.FINISHED
    assert run.epoch >= 2, "the restarted bridge's worker took the run over"
    assert [r.last_user_text for r in b.provider.task_requests] == ["survive a crash"]


def test_a_token_the_homeserver_refuses_is_a_clear_error(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    b = bridged([_room(people)], start=False)
    b.bot = MatrixUser(people.hs, people.bot.user_id, "syt_not_a_token")
    b.start(wait=False)
    assert b.proc is not None
    assert b.proc.wait(30) == 2
    assert "refused the access token in $TEST_MATRIX_TOKEN (M_UNKNOWN_TOKEN" in b.output()


def _texts(b: Bridged, session: str) -> str:
    return "\n".join(str(r.body) for r in b.ledger_call(lambda led: list(led.iter_rows(session))))


def test_a_message_taken_back_is_erased_with_what_it_asked_for(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)
    b = bridged([room])
    root = people.ana.send(room, "first ask", mention=people.bot)
    b.wait_posts(room, root, 1)
    secret = people.ana.send(room, "second ask, the password is hunter2", thread=root)
    b.wait_posts(room, root, 2)
    session, _ = b.ledger_call(lambda led: led.thread_of(b.name, room, root))
    asked = b.ledger_call(lambda led: led.event_run(b.name, secret))
    assert "hunter2" in _texts(b, session)

    people.ana.redact(room, secret)
    wait_until(lambda: "hunter2" not in _texts(b, session), "the message's row erased", 30)
    assert b.ledger_call(lambda led: led.run(asked)) is None  # its run and its answer went too
    assert "first ask" in _texts(b, session)  # the rest of the thread stays
    [receipt] = b.ledger_call(lambda led: led.erasures(limit=5))
    assert receipt.actor == "user:ana"
    assert list(receipt.selector) == ["row"]
    assert receipt.selector["row"].startswith(f"{session}#")
    # A redaction of something that was no request (the bot's own answer) erases nothing.
    # (A redacted event leaves the thread: the status notice is looked for by its text.)
    people.ana.redact(room, b.bot_posts(room, root)[0]["event_id"])
    people.ana.send(room, "status", thread=root)

    def idle() -> bool:
        return any(p["content"].get("body", "").startswith("Idle") for p in b.bot_posts(room, root))

    wait_until(idle, "the status notice", 60)
    assert len(b.ledger_call(lambda led: led.erasures(limit=5))) == 1


def test_a_message_delivered_into_a_live_run_and_taken_back_is_erased(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    room = _room(people)

    def script(req: RecordedRequest) -> Reply:
        if req.last_user_text == "the first thing":
            return Reply("working on the first thing", delay_s=6)
        return Reply("noted")  # never quoting it: the user's row alone holds the secret

    b = bridged([room], script=script)
    root = people.ana.send(room, "the first thing", mention=people.bot)
    b.provider.wait_for_requests(1, timeout=60)
    follow = people.ana.send(room, "also, my token is s3cret", thread=root)
    b.wait_posts(room, root, 1)
    session, _ = b.ledger_call(lambda led: led.thread_of(b.name, room, root))
    first = b.ledger_call(lambda led: led.event_run(b.name, root))
    wait_until(lambda: "s3cret" in _texts(b, session), "the delivered message's row", 30)

    people.ana.redact(room, follow)
    wait_until(lambda: "s3cret" not in _texts(b, session), "the delivered row erased", 30)
    kept = b.ledger_call(lambda led: led.get_run(first))  # the run it went into stays
    assert kept.extra.get("erased") is True
    assert "the first thing" in _texts(b, session)


def test_two_people_in_one_thread_each_see_what_their_grants_admit(
    people: People, bridged: Callable[..., Bridged]
) -> None:
    """ana (granted repo:acme/*) and bob (unmapped: matrix:<id>, no grants) in one thread: each
    message's row carries its sender's actor; what ana's run read under a source reaches bob's
    run only as a stand-in, never its text."""
    room = _room(people)

    def script(req: RecordedRequest) -> Reply:
        if req.contains("K-7731"):
            return Reply("the deploy key is K-7731")
        return Reply("nothing on that here")

    b = bridged([room], script=script)
    root = people.ana.send(room, "hello", mention=people.bot)
    b.wait_posts(room, root, 1)
    session, _ = b.ledger_call(lambda led: led.thread_of(b.name, room, root))
    # What the agent may read under a source: a note of the session carrying it.
    b.ledger_call(
        lambda led: led.add_note(
            session, "rev", "deploy key: K-7731", actor="user:ana", sources=("repo:acme/keys",)
        )
    )
    people.ana.send(room, "what is the deploy key?", thread=root)
    posts = b.wait_posts(room, root, 2)
    assert posts[1]["content"]["body"] == "the deploy key is K-7731"
    people.bob.send(room, "what did ana just learn?", thread=root)
    posts = b.wait_posts(room, root, 3)
    assert posts[2]["content"]["body"] == "nothing on that here"

    rows = b.ledger_call(lambda led: list(led.iter_rows(session)))
    said = [r for r in rows if r.body.get("role") == "user" and "origin" not in r.extra]
    users = [(r.actor, r.body["content"][0]["text"]) for r in said]  # copies of requests apart
    assert users == [
        ("user:ana", "hello"),
        ("user:ana", "what is the deploy key?"),
        (f"matrix:{people.bob.user_id}", "what did ana just learn?"),
    ]
    keyed = [r for r in rows if "K-7731" in str(r.body)]
    assert keyed
    assert all(r.sources == ("repo:acme/keys",) for r in keyed)
    asked = [r for r in b.provider.requests if not r.is_summary]
    bobs = asked[-1]
    assert bobs.last_user_text == "what did ana just learn?"
    assert not bobs.contains("K-7731")  # neither the note nor ana's answer, as text
    assert bobs.contains("withheld")  # the stand-in in their place
    assert asked[-2].contains("K-7731")  # ana's run was given it
