"""The harness's side of the ``recall`` and ``note`` tools (docs/contracts.md#recall-and-notes): a
Unix socket in the run
directory (mode 0600) that answers the extension inside pi (``extension/tools.ts``), one JSON
line each way per connection, for callers that present the run's capability token.

    channel = ToolChannel.new(run_dir)  # pi is started with channel.env
    tools = ToolServer(ledger=…, grants=…, fence=…, agent=…, actor=…, obligations=…,
                       channel=channel)
    await task_group.start(tools.serve)

pi never opens the ledger: every answer comes from :mod:`tether.recall` here, for the run's
actor (admission applies), and every row shown adds its sources to the run's obligations, so
the rows the run writes after a recall carry them (docs/security.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from tether.access import Obligations
from tether.errors import LedgerError, NotFound, RecallError
from tether.files import DIR_MODE
from tether.ledger import Fence, Ledger
from tether.pi.toolchannel import ToolChannel, ToolName
from tether.threads import in_thread

if TYPE_CHECKING:
    from tether.recall import RecallAnswer

__all__ = ["ToolServer"]

MAX_REQUEST_BYTES = 64 * 1024

log = logging.getLogger(__name__)


def _private_dir_ready(path: Path) -> bool:
    """``path`` is a directory of this user's, 0700; made so if it is missing (a takeover's
    channel: the lost harness may have removed it)."""
    try:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(found.st_mode)
        and found.st_uid == os.getuid()
        and stat.S_IMODE(found.st_mode) == DIR_MODE
    )


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` names (device, inode), or None if none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _int(value: Any, name: str) -> int | None:
    """An integer argument; small models sometimes send ``"10"`` for ``10``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise RecallError(f'"{name}" must be a row number, e.g. 10')
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise RecallError(f'"{name}" must be a row number, e.g. 10')


class ToolServer:
    """Answers one run's tool calls. Made before pi starts (pi needs :attr:`env`); serves from
    ``serve`` in the run's task group until that is cancelled."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        grants: Mapping[str, Sequence[str]],
        fence: Fence,
        agent: str,
        actor: str,
        obligations: Obligations,
        channel: ToolChannel,
    ) -> None:
        """``channel``: the socket and token the run's pi was started with."""
        self.ledger = ledger
        self.grants = grants
        self.fence = fence
        self.agent = agent
        self.actor = actor
        self.obligations = obligations
        self.channel = channel

    @property
    def path(self) -> Path:
        return self.channel.path

    @property
    def token(self) -> str:
        return self.channel.token

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen (the socket 0600), report started, answer until cancelled; then remove it,
        unless a newer owner of the run (a takeover) has bound its own socket there since."""
        if self.channel.private_dir is not None and not _private_dir_ready(
            self.channel.private_dir
        ):
            log.warning(
                "the tools socket's directory %s is not this user's private directory: the "
                "recall and note tools are not served for run %s",
                self.channel.private_dir,
                self.fence.run,
            )
            task_status.started()
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = await anyio.create_unix_listener(self.path)
        ours = _identity(self.path)
        try:
            self.path.chmod(0o600)
            async with listener:
                task_status.started()
                await listener.serve(self._handle)
        finally:
            if ours is not None and _identity(self.path) == ours:
                with contextlib.suppress(OSError):
                    self.path.unlink()
                if self.channel.private_dir is not None:
                    shutil.rmtree(self.channel.private_dir, ignore_errors=True)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            try:
                line = await reader.receive_until(b"\n", MAX_REQUEST_BYTES)
            except (anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.BrokenResourceError):
                return
            reply = await self.answer(line)
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n")

    async def answer(self, line: bytes) -> dict[str, Any]:
        """The reply to one request line (never raises for a bad request)."""
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "the request is not JSON"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "the request is not an object"}
        # Imported at the first call, as the recall below: most runs call no tool of tether's, and
        # every import at a run's start takes CPU from pi's own start.
        import hmac

        token = request.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode("utf-8"), self.token.encode("utf-8")
        ):
            return {"ok": False, "error": "the capability token is not this run's"}
        try:
            tool = ToolName(str(request.get("tool")))
        except ValueError:
            return {"ok": False, "error": f"unknown tool {request.get('tool')!r}"}
        args = request.get("args")
        if not isinstance(args, dict):
            args = {}
        try:
            if tool is ToolName.RECALL:
                return await self._recall(args)
            return await self._note(args)
        except (RecallError, NotFound) as exc:
            return {"ok": False, "error": str(exc)}
        except LedgerError as exc:
            return {"ok": False, "error": f"the ledger failed: {exc}; try again later"}

    async def _recall(self, args: dict[str, Any]) -> dict[str, Any]:
        from tether.recall import read_range, search

        query = args.get("query")
        if query is not None and not isinstance(query, str):
            raise RecallError('"query" must be text, e.g. "deploy password"')
        first, last = _int(args.get("from"), "from"), _int(args.get("to"), "to")
        found: RecallAnswer
        if query and query.strip():
            found = await in_thread(
                search,
                self.ledger,
                self.fence.session,
                query,
                actor=self.actor,
                grants=self.grants,
                first=first,
                last=last,
            )
        elif first is not None or last is not None:
            found = await in_thread(
                read_range,
                self.ledger,
                self.fence.session,
                first,
                last,
                actor=self.actor,
                grants=self.grants,
            )
        else:
            raise RecallError(
                'give a "query" (words to search for) or "from" and "to" (row numbers), '
                'e.g. recall({"query":"deploy password"}) or recall({"from":10,"to":41})'
            )
        # What the model is shown becomes part of what the run was given (docs/security.md).
        self.obligations.add(found.sources)
        details: dict[str, Any] = {
            "seqs": list(found.seqs),
            "withheld": [[a, b] for a, b in found.withheld],
        }
        if found.next is not None:
            details["next"] = found.next
        return {"ok": True, "text": found.to_text(), "details": details}

    async def _note(self, args: dict[str, Any]) -> dict[str, Any]:
        from tether.recall import add_note

        text = args.get("text")
        if not isinstance(text, str):
            raise RecallError('"text" must be the note\'s text')
        note = await in_thread(
            add_note,
            self.ledger,
            self.fence.session,
            self.agent,
            text,
            actor=self.actor,
            run=self.fence.run,
            sources=self.obligations.sources,
        )
        size = len(note.text.encode("utf-8"))
        return {
            "ok": True,
            "text": (
                f"Saved a note of {size} bytes. Later runs of agent {self.agent} on this "
                "session will see it with their newest notes."
            ),
            "details": {"bytes": size},
        }
