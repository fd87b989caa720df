"""The Matrix adapter (docs/bridges.md): a bot account's sync stream into :class:`Inbound`
messages, and posts as threaded replies, over matrix-nio (the ``matrix`` extra).

    adapter = MatrixAdapter(config.bridges.matrix, token, bridge)
    await adapter.run(stopped)      # sync, handle, post, until stopped is set

- The sync token is stored in the ledger after each batch is handled: a restart goes on from
  there (nothing replayed, nothing missed); a batch handled twice after a crash does nothing
  more (each event is its request's id). A first start, with no token, skips the history.
- A thread is ``m.relates_to {rel_type: m.thread}``; a message that mentions the bot outside a
  thread starts one, rooted at that message.
- Answers are ``m.text`` (refusals and control replies ``m.notice``) with the Markdown rendered
  to ``org.matrix.custom.html``, sent with the outbox's transaction ids (``PUT …/send/…/{txn}``:
  the homeserver answers a repeated id with the first event). nio's own retries are off: a
  ``M_LIMIT_EXCEEDED`` goes back to the outbox with its ``retry_after_ms``.
- A bound room with ``m.room.encryption`` is refused with one notice: the bot cannot read it.
"""

from __future__ import annotations

import base64
import logging
import re
from typing import Any

import anyio
from markdown_it import MarkdownIt

from tether.bridges.core import Bridge, BridgeSettings, Image, Inbound, PostFailed, RateLimited
from tether.config import Config, MatrixBridgeConfig
from tether.errors import ConfigError
from tether.harness.custody.placement import owner_id
from tether.ledger import Ledger
from tether.ledger.bridges import MessageKind
from tether.pi.install import PiInstall
from tether.service.state import ServiceState
from tether.service.worker import Worker

try:
    import aiohttp
    import nio
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "the Matrix bridge needs matrix-nio: pip install 'tether[matrix]'", name=exc.name
    ) from exc

__all__ = ["ENCRYPTED_NOTICE", "MatrixAdapter", "render_html", "serve"]

log = logging.getLogger(__name__)

ENCRYPTED_NOTICE = (
    "This room is end-to-end encrypted: the tether bot cannot read it and does not answer here. "
    "Use an unencrypted room bound to an agent."
)
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
RETRY_SYNC_S = 2.0
TIMELINE_LIMIT = 50
"""Events per room a sync returns at most; more are read back (``/messages``) to the stored
position."""
NETWORK_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)
"""A homeserver away or unreachable: waited out, never fatal."""

_markdown = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def render_html(text: str) -> str:
    """Markdown as the HTML Matrix clients show (raw HTML in it is escaped, never passed on)."""
    return str(_markdown.render(text)).strip()


class MatrixAdapter:
    """A bot account on a homeserver, feeding one :class:`Bridge`."""

    def __init__(self, config: MatrixBridgeConfig, token: str, bridge: Bridge) -> None:
        self.config = config
        self.bridge = bridge
        self.client = nio.AsyncClient(
            config.homeserver,
            config.user,
            config=nio.AsyncClientConfig(
                # The outbox retries, durably: nio's in-process retries would hold a post (and
                # every post behind it) asleep, and lose the wait on a restart.
                max_limit_exceeded=0,
                max_timeouts=0,
                store_sync_tokens=False,
                encryption_enabled=False,
            ),
        )
        self.client.access_token = token
        self.client.user_id = config.user
        self.rooms: dict[str, str] = {}
        """Room id -> agent, the aliases resolved (:meth:`bind`)."""
        self.encrypted: set[str] = set()
        self._since: str | None = None
        localpart = config.user[1:].partition(":")[0]
        self._leading = re.compile(
            rf"^\s*(?:{re.escape(config.user)}|@?{re.escape(localpart)}\b)\s*[:,]?\s*",
            re.IGNORECASE,
        )

    # -- set-up ---------------------------------------------------------------------------------

    async def bind(self) -> dict[str, str]:
        """Resolve the bound rooms' aliases and join them (a room the bot cannot join yet, not
        invited, is joined when an invite arrives). Returns room id -> agent."""
        who = await self.client.whoami()
        if isinstance(who, nio.WhoamiError):
            raise ConfigError(
                f"{self.config.homeserver} refused the access token in ${self.config.token_env} "
                f"({who.status_code}: {who.message}): set it to a token of {self.config.user}"
            )
        if who.user_id != self.config.user:
            raise ConfigError(
                f"the token in ${self.config.token_env} is {who.user_id}'s, not "
                f"[bridges.matrix] user {self.config.user}'s"
            )
        for room, agent in self.config.rooms.items():
            room_id = room
            if room.startswith("#"):
                found = await self.client.room_resolve_alias(room)
                if isinstance(found, nio.RoomResolveAliasError):
                    log.warning("room alias %s does not resolve (%s); skipped", room, found.message)
                    continue
                room_id = found.room_id
            self.rooms[room_id] = agent
            joined = await self.client.join(room_id)
            if isinstance(joined, nio.JoinError):
                log.info("not joined to %s yet (%s): joining on invite", room, joined.message)
        return self.rooms

    async def close(self) -> None:
        await self.client.close()

    # -- the sync loop ---------------------------------------------------------------------------

    async def run(self, stopped: anyio.Event) -> None:
        """Sync and handle each batch until ``stopped``; the homeserver being away is waited
        out (the outbox keeps what is to be posted)."""
        while not stopped.is_set():
            try:
                await self.sync_once()
            except NETWORK_ERRORS as exc:
                log.warning("sync failed (%s); trying again in %.0f s", exc, RETRY_SYNC_S)
            except Exception:
                # A batch the bridge could not handle: its position is not stored, so it is
                # handled again (each event is its request's id), after a pause.
                log.exception("handling a sync failed; trying again in %.0f s", RETRY_SYNC_S)
            else:
                continue
            with anyio.move_on_after(RETRY_SYNC_S):
                await stopped.wait()

    async def sync_once(self) -> None:
        # The stored position at start, then this process's own: another process on the
        # ledger storing its (older or newer) position never moves this one's stream.
        since = self._since if self._since is not None else await self.bridge.cursor()
        if since is None:
            # A first start: take the position, and the rooms' state, without the history.
            resp = await self.client.sync(
                timeout=0, full_state=True, sync_filter={"room": {"timeline": {"limit": 0}}}
            )
        else:
            resp = await self.client.sync(
                timeout=int(self.config.sync_timeout_s * 1000),
                since=since,
                sync_filter={"room": {"timeline": {"limit": TIMELINE_LIMIT}}},
            )
        if isinstance(resp, nio.SyncError):
            log.warning("sync refused: %s %s", resp.status_code, resp.message)
            await anyio.sleep(RETRY_SYNC_S)
            return
        await self.handle_sync(resp, since=since)
        await self.bridge.save_cursor(resp.next_batch)
        self._since = resp.next_batch

    async def handle_sync(self, resp: nio.SyncResponse, *, since: str | None) -> None:
        """Handle one sync batch (``since``: the position it was asked from; None on a first
        start, whose history is skipped)."""
        for room_id in resp.rooms.invite:
            if room_id in self.rooms:
                await self.client.join(room_id)
        for room_id, info in resp.rooms.join.items():
            if room_id not in self.rooms:
                continue  # an unbound room: ignored
            events = [*info.state, *info.timeline.events]
            room = self.client.rooms.get(room_id)
            if any(isinstance(e, nio.RoomEncryptionEvent) for e in events) or (
                room is not None and room.encrypted
            ):
                await self._refuse_encrypted(room_id)
                continue
            if since is None:
                continue
            timeline = list(info.timeline.events)
            if info.timeline.limited:
                # More happened since the last sync than one batch holds (the bridge was away):
                # the rest, back to the stored position, so nothing is missed.
                timeline = await self._gap(room_id, info.timeline.prev_batch, since) + timeline
            for event in timeline:
                if isinstance(event, nio.RedactionEvent) and event.redacts:
                    await self.bridge.redacted(room_id, event.redacts, event.sender)
                    continue
                msg = await self.inbound(room_id, event)
                if msg is not None:
                    await self.bridge.handle(msg)

    async def _gap(self, room_id: str, start: str | None, since: str) -> list[Any]:
        """The room's events from ``since`` up to ``start`` (a limited timeline's
        ``prev_batch``), oldest first."""
        older: list[Any] = []
        while start:
            got = await self.client.room_messages(
                room_id, start=start, end=since, direction=nio.MessageDirection.back, limit=100
            )
            if isinstance(got, nio.RoomMessagesError):
                log.warning(
                    "reading back %s failed: %s; events may be missed", room_id, got.message
                )
                break
            older[:0] = reversed(got.chunk)
            if not got.chunk or got.end is None or got.end == start:
                break
            start = got.end
        log.info("read back %d event(s) of %s missed while away", len(older), room_id)
        return older

    async def _refuse_encrypted(self, room_id: str) -> None:
        if room_id in self.encrypted:
            return
        self.encrypted.add(room_id)
        await self.bridge.notice(f"encrypted:{room_id}", room_id, "", ENCRYPTED_NOTICE)

    # -- events into messages --------------------------------------------------------------------

    async def inbound(self, room_id: str, event: Any) -> Inbound | None:
        """The message ``event`` is for the bridge, or None (not a message, or the bot's own)."""
        if getattr(event, "sender", None) == self.config.user:
            return None
        if isinstance(event, nio.RoomMessageText):
            text = event.body
            images: tuple[Image, ...] = ()
        elif isinstance(event, nio.RoomMessageImage):
            image = await self._image(event)
            if image is None:
                return None
            text, images = "", (image,)
        else:
            return None
        content: dict[str, Any] = event.source.get("content") or {}
        relation = content.get("m.relates_to") or {}
        if relation.get("rel_type") == "m.replace":
            return None  # an edit: its request was the original message
        root = relation.get("event_id") if relation.get("rel_type") == "m.thread" else None
        mentions = content.get("m.mentions") or {}
        mentioned = self.config.user in (mentions.get("user_ids") or []) or self._names_bot(text)
        if images and not text:
            text = f"(an image: {content.get('body') or 'untitled'})"
        return Inbound(
            event=event.event_id,
            room=room_id,
            root=root,
            sender=event.sender,
            text=self._without_mention(text),
            mentions_bot=mentioned,
            images=images,
        )

    def _names_bot(self, text: str) -> bool:
        return self.config.user in text or bool(self._leading.match(text))

    def _without_mention(self, text: str) -> str:
        """The text without the leading mention clients put in (``@tether:hs: …``,
        ``tether, …``)."""
        return self._leading.sub("", text, count=1).strip()

    async def _image(self, event: nio.RoomMessageImage) -> Image | None:
        info = (event.source.get("content") or {}).get("info") or {}
        mime = str(info.get("mimetype") or "")
        if mime not in IMAGE_TYPES:
            return None
        got = await self.client.download(mxc=event.url)
        if isinstance(got, nio.DownloadError):
            log.warning("image %s could not be downloaded: %s", event.event_id, got.message)
            return None
        return Image(mime_type=mime, data=base64.b64encode(got.body).decode("ascii"))

    # -- the Adapter side ------------------------------------------------------------------------

    async def post(self, room: str, root: str, text: str, *, kind: MessageKind, txn: str) -> str:
        content: dict[str, Any] = {
            "msgtype": "m.notice" if kind is MessageKind.NOTICE else "m.text",
            "body": text,
            "format": "org.matrix.custom.html",
            "formatted_body": render_html(text),
        }
        if root:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": root,
                # Clients without threads show it as a reply to the root.
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": root},
            }
        try:
            resp = await self.client.room_send(room, "m.room.message", content, tx_id=txn)
        except NETWORK_ERRORS as exc:
            raise PostFailed(f"the homeserver is unreachable: {exc}") from exc
        if isinstance(resp, nio.RoomSendError):
            if resp.status_code == "M_LIMIT_EXCEEDED":
                wait_ms = resp.retry_after_ms or 1000
                raise RateLimited(wait_ms / 1000, resp.message)
            raise PostFailed(
                f"{resp.status_code}: {resp.message}", permanent=resp.status_code == "M_FORBIDDEN"
            )
        return str(resp.event_id)

    async def typing(self, room: str, on: bool) -> None:
        try:
            got = await self.client.room_typing(room, typing_state=on, timeout=10_000)
        except NETWORK_ERRORS as exc:
            log.debug("typing notice failed: %s", exc)
            return
        if isinstance(got, nio.RoomTypingError):
            log.debug("typing notice refused: %s", got.message)


async def serve(
    config: Config,
    ledger: Ledger,
    *,
    token: str,
    workers: int,
    stopped: anyio.Event,
    pi: PiInstall | None = None,
) -> None:
    """``tether bridge matrix``: the bot's sync, the outbox, and ``workers`` in-process workers
    (0: the runs are left to other workers on the ledger), until ``stopped``."""
    matrix = config.bridges.matrix
    if matrix is None:
        raise ConfigError(
            f"{config.path or 'tether.toml'} has no [bridges.matrix] section (docs/bridges.md)"
        )
    st = ServiceState(config=config, ledger=ledger)
    rooms: dict[str, str] = {}
    bridge = Bridge(
        st,
        BridgeSettings(
            name=f"matrix:{matrix.user}",
            rooms=rooms,  # filled by bind(): aliases resolve to room ids
            actor_of=matrix.actor_of,
            split_chars=matrix.split_chars,
            lease_s=matrix.lease_s,
            retry_s=matrix.retry_s,
            poll_s=matrix.poll_s,
        ),
        owner=owner_id(),
    )
    adapter = MatrixAdapter(matrix, token, bridge)
    try:
        while True:
            try:
                rooms.update(await adapter.bind())
                break
            except NETWORK_ERRORS as exc:
                log.warning(
                    "the homeserver at %s is unreachable (%s); trying again in %.0f s",
                    matrix.homeserver,
                    exc,
                    RETRY_SYNC_S,
                )
            with anyio.move_on_after(RETRY_SYNC_S):
                await stopped.wait()
            if stopped.is_set():
                return
        log.info("bridging %d room(s) as %s", len(rooms), matrix.user)
        outbox_stop = anyio.Event()
        async with anyio.create_task_group() as outer:
            # The outbox outlives the sync and the workers: answers of runs that end while the
            # workers drain are still posted.
            outer.start_soon(bridge.serve_outbox, adapter, outbox_stop)
            bridge.tasks = outer
            async with anyio.create_task_group() as runs:
                if workers > 0:
                    worker = Worker(ledger, config, concurrency=workers, pi=pi)
                    st.workers.append(worker)
                    runs.start_soon(worker.run)
                async with anyio.create_task_group() as sync:
                    sync.start_soon(adapter.run, stopped)
                    await stopped.wait()
                    sync.cancel_scope.cancel()  # a long poll would hold the exit
                for w in st.workers:
                    w.stop()
            await bridge.answers()
            outbox_stop.set()
    finally:
        await adapter.close()
