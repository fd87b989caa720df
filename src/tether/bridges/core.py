"""The run side of a chat bridge (docs/bridges.md), the same for every platform: a thread is a
session, a message is a request queued as the service queues one, and answers, refusals and
control replies go out through the ledger's outbox (:mod:`tether.ledger.bridges`).

An adapter (:class:`Adapter`, e.g. :mod:`tether.bridges.matrix`) knows the platform: it reads
its events into :class:`Inbound` messages for :meth:`Bridge.handle`, stores its stream position
with :meth:`Bridge.cursor` / :meth:`Bridge.save_cursor`, and posts what :meth:`Bridge.deliver`
gives it. Nothing here speaks a platform's protocol.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc
from fastapi import HTTPException
from pydantic import ValidationError

from tether.access import Admission
from tether.errors import LedgerError, SessionRefusing, TetherError
from tether.harness.custody.erasing import erase_stopping
from tether.harness.relay import Deliver
from tether.ledger import Ledger, Run, RunStatus
from tether.ledger.bridges import BridgeMessage, MessageKind
from tether.ledger.lifecycle import Selector
from tether.ledger.limits import LimitExceeded
from tether.ledger.models import now_iso
from tether.ledger.usage import BudgetExhausted
from tether.service.api import RequestIn, admit_and_enqueue, relay_request
from tether.service.attachments import ImageIn
from tether.service.auth import Caller
from tether.service.state import ServiceState
from tether.threads import in_thread

__all__ = [
    "Adapter",
    "Bridge",
    "BridgeSettings",
    "Control",
    "Image",
    "Inbound",
    "PostFailed",
    "RateLimited",
    "split_text",
]

log = logging.getLogger(__name__)

MAX_RETRY_S = 300.0
REFUSALS = (HTTPException, LimitExceeded, BudgetExhausted, SessionRefusing, ValidationError)
"""What queueing a request refuses it with (the service's 4xx answers): one line in the thread.
Anything else (the ledger unreachable) leaves the event to be handled again."""
TYPING_EVERY_S = 4.0
"""How often live runs' rooms are told the bot is typing (each notice lasts a little longer)."""


class Control(enum.StrEnum):
    """Words that, alone in a thread the bridge answers, act on the thread's session."""

    STOP = "stop"
    """Stop the thread's live run softly (its requester, or an actor of [service] operators)."""
    STATUS = "status"
    """Say what the thread's session is doing."""


@dataclass(frozen=True)
class Image:
    """An image sent in the chat, as the request's attachment."""

    mime_type: str
    data: str
    """Base64 (standard alphabet, padded)."""


@dataclass(frozen=True)
class Inbound:
    """A chat message, as an adapter hands it over."""

    event: str
    """The platform's id of the message: the request's ``request_id``."""
    room: str
    root: str | None
    """The thread's root message, or None when the message is not in a thread (it then starts
    one, rooted at itself)."""
    sender: str
    """The platform's user id (the bridge maps it to an actor)."""
    text: str
    """The message's text, the mention of the bot taken out."""
    mentions_bot: bool
    images: tuple[Image, ...] = ()


class RateLimited(Exception):
    """The platform asked to wait before posting again."""

    def __init__(self, retry_after_s: float, detail: str) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class PostFailed(Exception):
    """A post did not go through. ``permanent``: trying again will not help (the bot was
    removed from the room); otherwise it is tried again with backoff."""

    def __init__(self, detail: str, *, permanent: bool = False) -> None:
        super().__init__(detail)
        self.permanent = permanent


class Adapter(Protocol):
    """What a platform adapter does for :class:`Bridge`. Slack (slack-bolt, Socket Mode) would
    implement the same: ``post`` with ``chat.postMessage`` (``thread_ts`` = the root, a
    ``client_msg_id`` from ``txn``), ``typing`` with the assistant status."""

    async def post(self, room: str, root: str, text: str, *, kind: MessageKind, txn: str) -> str:
        """Post ``text`` (Markdown) in the thread ``root`` of ``room``; ``txn`` is the
        platform's idempotency key (the same ``txn`` again must not post twice). Returns the
        posted message's id; raises :class:`RateLimited` or :class:`PostFailed`."""
        ...

    async def typing(self, room: str, on: bool) -> None:
        """Show (or stop showing) that the bot is typing in ``room``; best effort."""
        ...


@dataclass(frozen=True)
class BridgeSettings:
    name: str
    """The bridge's key in the ledger (``matrix:@tether:example.org``)."""
    rooms: dict[str, str]
    """Room id -> the agent that answers there (rooms not in it are ignored)."""
    actor_of: Callable[[str], str]
    split_chars: int = 12_000
    lease_s: float = 30.0
    retry_s: float = 2.0
    poll_s: float = 0.5


def session_for(bridge: str, room: str, root: str) -> str:
    """The session id a new thread gets: stable, so every process derives the same one (the
    ledger's mapping stays the authority)."""
    digest = hashlib.sha256(f"{bridge}\n{room}\n{root}".encode()).hexdigest()
    return f"{bridge.partition(':')[0]}-{digest[:20]}"


def split_text(text: str, limit: int) -> list[str]:
    """``text`` in parts of at most ``limit`` characters, cut at the last paragraph break, else
    line break, else space before the limit (a word longer than the limit is cut)."""
    parts: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), 0) or max(window.rfind("\n"), 0) or window.rfind(" ")
        if cut <= limit // 4:  # no boundary near the end: cut hard rather than post slivers
            cut = limit
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest or not parts:
        parts.append(rest)
    return parts


def one_line(text: str, limit: int = 400) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def refusal_line(exc: BaseException) -> str:
    """A refused request, explained in one line."""
    if isinstance(exc, HTTPException):
        detail: Any = exc.detail
        if isinstance(detail, dict):
            return one_line(
                f"Refused ({detail.get('reason', exc.status_code)}): {detail.get('detail')}"
            )
        return one_line(f"Refused: {detail}")
    if isinstance(exc, LimitExceeded):
        return one_line(f"Refused (limit): {exc}")
    if isinstance(exc, BudgetExhausted):
        return one_line(f"Refused (budget_exhausted): {exc}")
    if isinstance(exc, SessionRefusing):
        return one_line(f"Refused (session_refusing): {exc}")
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return one_line(f"Refused: {first.get('loc', ('request',))[-1]}: {first.get('msg')}")
    return one_line(f"Refused: {exc}")


def answer_text(run: Run) -> str:
    """What the thread is told when ``run`` ended."""
    extra = run.extra
    answer = (extra.get("answer") or "").strip()
    if run.status is RunStatus.FINISHED:
        text = answer or "_(the run finished without an answer)_"
    elif run.status is RunStatus.FAILED:
        text = (answer + "\n\n" if answer else "") + one_line(
            f"The run failed: {extra.get('error') or extra.get('stop_reason') or 'no reason given'}"
        )
    else:
        why = extra.get("stop_reason") or "stopped"
        text = (answer + "\n\n" if answer else "") + f"_(stopped: {one_line(str(why))})_"
    if extra.get("checkpoint") == "written":
        text += "\n\n_(checkpoint written: later answers build on its summary)_"
    return text


@dataclass
class Bridge:
    """The run side of one bridge, over the service's state (config, ledger, workers)."""

    st: ServiceState
    settings: BridgeSettings
    owner: str
    tasks: anyio.abc.TaskGroup | None = None
    """Where relays into live runs wait (else the caller waits for each)."""
    _typing: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.settings.name

    # -- the event stream's position -----------------------------------------------------------

    async def cursor(self) -> str | None:
        return await in_thread(self.st.ledger.bridge_cursor, self.name)

    async def save_cursor(self, token: str) -> None:
        await in_thread(self.st.ledger.set_bridge_cursor, self.name, token)

    # -- inbound ---------------------------------------------------------------------------------

    async def handle(self, msg: Inbound) -> None:
        """A chat message: ignored (another room; not for the bot), a control word, or a
        request. Safe to call again with the same message (a redelivery does nothing more)."""
        bound = self.settings.rooms.get(msg.room)
        if bound is None:
            return
        root = msg.root or msg.event
        known = None
        if msg.root is not None:
            known = await in_thread(self.st.ledger.thread_of, self.name, msg.room, msg.root)
        if known is None and not msg.mentions_bot:
            return
        session, agent = await in_thread(
            self.st.ledger.thread_session,
            self.name,
            msg.room,
            root,
            session=session_for(self.name, msg.room, root),
            agent=bound,
        )
        actor = self.settings.actor_of(msg.sender)
        word = msg.text.strip().lower()
        if known is not None and word in Control.__members__.values():
            await self._control(Control(word), msg, root, session, actor)
            return
        await self._request(msg, root, session, agent, actor)

    async def _request(self, msg: Inbound, root: str, session: str, agent: str, actor: str) -> None:
        caller = Caller(actor=actor, admission=Admission(self.st.config.access.grants, actor))
        # While the thread's run is live, a message goes into it (pi's follow-up, before the
        # turn settles) as the service's "deliver": "follow_up" does; images travel only queued.
        live = not msg.images and bool(await in_thread(self.st.ledger.live_runs, session=session))
        try:
            body = RequestIn(
                agent=agent,
                text=msg.text.strip(),
                request_id=msg.event,
                deliver=Deliver.FOLLOW_UP if live else Deliver.QUEUE,
                images=[
                    ImageIn.model_validate({"data": i.data, "mimeType": i.mime_type})
                    for i in msg.images
                ],
            )
            run, created = await in_thread(admit_and_enqueue, self.st, session, body, caller, {})
        except REFUSALS as exc:
            log.info("refused %s in %s: %s", msg.event, session, exc)
            await self._notice(f"refusal:{msg.event}", msg.room, root, refusal_line(exc))
            return
        await in_thread(
            self.st.ledger.record_event, self.name, msg.event, room=msg.room, root=root, run=run.id
        )
        log.info("%s in %s: run %s%s", msg.event, session, run.id, "" if created else " (again)")
        if not created:
            return
        if body.deliver is Deliver.QUEUE:
            self.st.queued()
        elif self.tasks is not None:
            # The live run's worker takes it (or, once the turn has settled, it stays queued as
            # the session's next run: never lost); the wait is the relay's, not the sync's.
            self.tasks.start_soon(self._relay, run, body)
        else:
            await self._relay(run, body)

    async def _relay(self, run: Run, body: RequestIn) -> None:
        try:
            await relay_request(self.st, run, body)
        except TetherError as exc:  # it stays queued: the session's next run
            log.warning("relaying %s into the live run failed: %s", run.id, exc)

    async def redacted(self, room: str, event: str, sender: str) -> None:
        """A message taken back (a redaction, which the homeserver allowed its sender or a
        moderator to make): a request still queued is withdrawn; otherwise its row is erased,
        with what derives from it (the rows of the run it asked for, a checkpoint covering it),
        as ``tether erase`` does (a live run on the session is stopped first). The receipt
        names who took it back. Not a request of this bridge's: nothing to do."""
        if room not in self.settings.rooms:
            return
        ledger = self.st.ledger
        run_id = await in_thread(ledger.event_run, self.name, event)
        found = await in_thread(ledger.run, run_id) if run_id is not None else None
        if found is None:
            return  # not a request, or erased already
        actor = self.settings.actor_of(sender)
        if found.status is RunStatus.QUEUED and not found.extra.get("delivered_into"):
            why = f"withdrawn: {actor} took the message back before it started"
            extra = {"withdrawn_by": actor, "withdrawn_at": now_iso(), "stop_reason": "withdrawn"}
            ended = await in_thread(
                ledger.end_queued_run,
                found.id,
                RunStatus.INTERRUPTED,
                extra={**extra, "error": why},
            )
            if ended is not None:
                log.info("%s taken back: its queued run %s withdrawn", event, found.id)
                return
            found = await in_thread(ledger.get_run, found.id)  # claimed meanwhile
        seq = await in_thread(_message_row, ledger, found)
        if seq is None:
            log.warning("%s taken back, but its row in %s was not found", event, found.session)
            return
        done = await erase_stopping(
            ledger, self.st.config, Selector.row(found.session, seq), actor=actor
        )
        counts = done.to_json().get("counts") if done is not None else None
        log.info("%s taken back: row %s of %s erased %s", event, seq, found.session, counts)

    async def _control(
        self, word: Control, msg: Inbound, root: str, session: str, actor: str
    ) -> None:
        ledger = self.st.ledger
        live = await in_thread(ledger.live_runs, session=session)
        if word is Control.STATUS:
            queued = await in_thread(ledger.queued_runs, session, limit=100)
            if live:
                said = f"Working: run {live[0].id} is live (started {live[0].started})"
            else:
                said = "Idle: no run is live"
            said += f"; {len(queued)} queued. Session {session}."
        else:
            stopped = []
            for run in live:
                requester = (run.extra.get("request") or {}).get("actor")
                if actor != requester and actor not in self.st.config.service.operators:
                    continue
                if await in_thread(
                    ledger.request_stop,
                    run.id,
                    hard=False,
                    detail=f"stopped by {actor} in the chat",
                    actor=actor,
                ):
                    stopped.append(run.id)
            if stopped:
                said = f"Stopping run {', '.join(stopped)}."
            elif live:
                said = (
                    f"Not stopped: run {live[0].id} was asked for by someone else; only its "
                    "requester or an operator may stop it."
                )
            else:
                said = "Nothing to stop: no run is live in this thread."
        await self._notice(f"control:{msg.event}", msg.room, root, said)

    async def _notice(self, key: str, room: str, root: str, text: str) -> None:
        await in_thread(
            self.st.ledger.queue_message,
            self.name,
            key,
            room=room,
            root=root,
            kind=MessageKind.NOTICE,
            body=text,
        )

    async def notice(self, key: str, room: str, root: str, text: str) -> None:
        """Queue a one-line notice under ``key`` (once per key), e.g. an encrypted room's."""
        await self._notice(key, room, root, text)

    # -- outbound --------------------------------------------------------------------------------

    async def answers(self) -> int:
        """Queue the answers of runs that ended; how many."""
        ledger = self.st.ledger
        pending = await in_thread(ledger.pending_answers, self.name)
        for p in pending:
            run = await in_thread(ledger.get_run, p.run)
            if run.extra.get("delivered_into"):
                # Its request went into a live run: that run's answer answers it.
                await in_thread(ledger.mark_answered, self.name, run.id)
                continue
            await in_thread(
                ledger.queue_message,
                self.name,
                f"answer:{run.id}",
                room=p.room,
                root=p.root,
                kind=MessageKind.ANSWER,
                body=answer_text(run),
                answered=run.id,
            )
        return len(pending)

    async def deliver(self, adapter: Adapter) -> int:
        """Post the messages due; how many were claimed."""
        claimed = await in_thread(
            self.st.ledger.claim_messages,
            self.name,
            owner=self.owner,
            lease_s=self.settings.lease_s,
        )
        for message in claimed:
            await self._post(adapter, message)
        return len(claimed)

    async def _post(self, adapter: Adapter, message: BridgeMessage) -> None:
        ledger = self.st.ledger
        parts = split_text(message.body, self.settings.split_chars)
        try:
            for i in range(message.parts_sent, len(parts)):
                # The same row and part give the same transaction id: a retry after a crash (or
                # a lost reply) is the platform's same message, never a second one.
                await adapter.post(
                    message.room,
                    message.root,
                    parts[i],
                    kind=message.kind,
                    txn=f"tether-{message.txn}-{i}",
                )
                await in_thread(
                    ledger.message_part_sent, message.id, owner=self.owner, parts_sent=i + 1
                )
        except RateLimited as exc:
            log.info("rate limited posting %s: retrying in %.1f s", message.key, exc.retry_after_s)
            await in_thread(
                ledger.message_failed,
                message.id,
                owner=self.owner,
                error=f"M_LIMIT_EXCEEDED: {exc}",
                retry_at=time.time() + exc.retry_after_s,
            )
            return
        except PostFailed as exc:
            wait = min(self.settings.retry_s * 2 ** (message.attempts - 1), MAX_RETRY_S)
            log.warning(
                "posting %s failed (%s); %s",
                message.key,
                exc,
                "giving up" if exc.permanent else f"retrying in {wait:.1f} s",
            )
            await in_thread(
                ledger.message_failed,
                message.id,
                owner=self.owner,
                error=str(exc),
                retry_at=None if exc.permanent else time.time() + wait,
            )
            return
        await in_thread(ledger.message_sent, message.id)

    async def typing(self, adapter: Adapter) -> None:
        """Rooms with a live run of the bridge's show typing; the others stop."""
        live = {room for room, _ in await in_thread(self.st.ledger.open_event_runs, self.name)}
        for room in live:
            await adapter.typing(room, True)
        for room in self._typing - live:
            await adapter.typing(room, False)
        self._typing = live

    async def serve_outbox(self, adapter: Adapter, stopped: anyio.Event) -> None:
        """Until ``stopped``: queue answers of ended runs, post what is due, keep typing."""
        last_typing = 0.0
        while not stopped.is_set():
            try:
                await self.answers()
                await self.deliver(adapter)
                if time.monotonic() - last_typing >= TYPING_EVERY_S:
                    last_typing = time.monotonic()
                    await self.typing(adapter)
            except (LedgerError, TetherError) as exc:
                log.warning("the bridge's outbox failed (%s); trying again", exc)
            with anyio.move_on_after(self.settings.poll_s):
                await stopped.wait()


def _message_row(ledger: Ledger, run: Run) -> int | None:
    """The seq of the row a chat message became: the request row of the run it asked for, or,
    for one delivered into a live run, the user message with its text and actor in that run."""
    if run.request_seq is not None:
        return run.request_seq
    into = run.extra.get("delivered_into")
    request = run.extra.get("request") or {}
    if not isinstance(into, str) or not isinstance(request, dict):
        return None
    live = ledger.run(into)
    if live is None or live.request_seq is None:
        return None
    text, actor = request.get("text"), request.get("actor")
    found: int | None = None
    # A delivered message is written after the live run's request: read from there (a bounded
    # read: a message delivered later than 2,000 rows into a run is not found, and logged).
    first = live.request_seq
    for row in ledger.rows_range(run.session, first, first + 2_000, limit=2_000):
        if row.run != into or row.actor != actor or row.body.get("role") != "user":
            continue
        parts = row.body.get("content")
        said = (
            "".join(
                p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text"
            )
            if isinstance(parts, list)
            else parts
        )
        if said == text:
            found = row.seq
    return found
