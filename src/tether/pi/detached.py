"""pi detached from the harness, behind the :class:`AgentTransport` seam
(docs/architecture.md#custody).

``KeeperTransport`` starts the keeper (:mod:`tether.pi.keeper`), which owns pi; the harness
writes commands to the FIFO in the run directory and reads pi's output from the events file
there, by offset. A harness that dies leaves pi running; a new one ``attach``-es to the same run
directory and reads the events from the start (the RPC client and the mirror are idempotent over
a replay).

Every command is handed to ``before_send`` (when given) before it reaches the FIFO: the
harness marks a ``prompt`` or ``compact`` there (:mod:`tether.harness.custody.markers`), so a
harness that takes the run over knows whether the summary command may have been delivered, and
never sends it again (invariant 16).

Cleanup signals pi only after confirming its pid still names the process the keeper started
(its start time), and not at all once the run has been ``disown``-ed (a newer owner holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import stat
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from tether.files import open_own
from tether.pi import keeper
from tether.pi.errors import PiStartupFailed, TransportClosed
from tether.pi.jsonl import LineSplitter
from tether.pi.keeper import read_placement
from tether.processes import alive, start_time
from tether.threads import in_thread

if TYPE_CHECKING:
    import psutil

__all__ = ["KeeperTransport", "Placement", "read_placement"]

READ_CHUNK = 256 * 1024
STDERR_TAIL_LINES = 40
_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.01
_WATCH_TIMEOUT_S = 0.25
"""A safety net: the reader looks again at least this often even without a notification."""
_STARTUP_TIMEOUT_S = 20.0
_KEEPER_LOOK_S = 0.25
"""How often an idle reader confirms the keeper still lives: a killed keeper writes no
``exit.json``, and without this look the run would wait for its deadline."""

Placement = dict[str, Any]


def read_exit(run_dir: Path) -> int | None:
    try:
        with open_own(run_dir / keeper.EXIT_NAME) as f:  # never through a link
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    status = data.get("status") if isinstance(data, dict) else None
    return status if isinstance(status, int) else None


class KeeperTransport:
    """pi under a keeper. ``async with KeeperTransport.adopt(...)`` takes one this process
    started (a :class:`~tether.pi.launch.PiLaunch`);
    ``async with KeeperTransport.attach(run_dir)`` takes over one that is running."""

    def __init__(
        self,
        run_dir: Path,
        placement: Placement,
        *,
        grace_s: float,
        keeper_proc: subprocess.Popen[bytes] | None = None,
        stderr_log: Path | None = None,
        before_send: Callable[[bytes], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.placement = placement
        self._grace = grace_s
        self._keeper = keeper_proc
        self._log = stderr_log or run_dir / "pi.log"
        self._fifo = run_dir / keeper.FIFO_NAME
        self._events = run_dir / keeper.EVENTS_NAME
        self._fd: int | None = None
        self._closed = False
        self._disowned = False
        self._stdin_closed = False
        self._lost: str | None = None
        self._next_keeper_look = 0.0
        self._write_lock = anyio.Lock()
        self._before_send = before_send
        self.offset = 0
        """How far the events file has been read."""
        self.caught_up = anyio.Event()
        """Set once everything in the events file when reading began has been delivered."""

    # -- starting and attaching ------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def adopt(
        cls,
        run_dir: Path,
        proc: subprocess.Popen[bytes],
        *,
        stderr_log: Path,
        grace_s: float = 3.0,
        before_send: Callable[[bytes], None] | None = None,
    ) -> AsyncIterator[KeeperTransport]:
        """Take over a keeper this process started (``keeper.start``, or a
        :class:`~tether.pi.launch.PiLaunch`): wait for it to record pi, then talk to pi."""
        try:
            placement = await cls._await_placement(run_dir, proc)
        except BaseException:
            with contextlib.suppress(OSError):
                proc.kill()
            raise
        # The keeper is pi's parent and has not reaped it, and we have not reaped the keeper:
        # neither pid can name another process yet, so their start times read now are theirs.
        placement["pi_start"] = start_time(placement.get("pi_pid"))
        placement["keeper_start"] = start_time(placement.get("keeper_pid"))
        transport = cls(
            run_dir,
            placement,
            grace_s=grace_s,
            keeper_proc=proc,
            stderr_log=stderr_log,
            before_send=before_send,
        )
        try:
            yield transport
        finally:
            await transport.aclose()

    @classmethod
    @contextlib.asynccontextmanager
    async def attach(
        cls,
        run_dir: Path,
        placement: Placement,
        *,
        grace_s: float = 3.0,
        before_send: Callable[[bytes], None] | None = None,
    ) -> AsyncIterator[KeeperTransport]:
        """Take over the keeper of ``run_dir``, as the run's recorded ``placement`` names it
        (pids with their start times)."""
        if not isinstance(placement.get("pi_pid"), int):
            raise TransportClosed(f"no pi recorded for {run_dir}")
        transport = cls(run_dir, placement, grace_s=grace_s, before_send=before_send)
        try:
            yield transport
        finally:
            await transport.aclose()

    @staticmethod
    async def _await_placement(run_dir: Path, proc: subprocess.Popen[bytes]) -> Placement:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while True:
            found = read_placement(run_dir)
            if found is not None:
                return found
            if proc.poll() is not None:
                raise PiStartupFailed(f"pi's keeper exited at once (status {proc.returncode})")
            if time.monotonic() > deadline:
                proc.kill()
                raise PiStartupFailed("pi's keeper did not start pi in time")
            await anyio.sleep(0.005)

    # -- the AgentTransport seam -----------------------------------------------------------------

    @property
    def pid(self) -> int:
        return int(self.placement["pi_pid"])

    @property
    def exit_status(self) -> int | None:
        return read_exit(self.run_dir)

    def diagnostics(self) -> str:
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        with contextlib.suppress(OSError), open_own(self._log) as f:
            f.seek(max(0, f.seek(0, 2) - 64 * 1024))
            for line in f.read().split(b"\n"):
                if line.strip():
                    tail.append(line.decode("utf-8", "replace"))
        return "\n".join(tail)

    def pi_placement(self) -> dict[str, Any]:
        return dict(self.placement)

    async def fenced_out(self) -> None:
        # pi outlives this harness under its keeper: the newer owner has it now.
        self.disown()

    def channel_ok(self) -> bool:
        """The command FIFO is still in the run directory (docs/architecture.md#custody: without
        it, no
        checkpoint and no further prompts)."""
        try:
            return os.path.exists(self._fifo) and not self._closed
        except OSError:
            return False

    def pi_alive(self) -> bool:
        return alive(self.placement.get("pi_pid"), self.placement.get("pi_start"))

    async def lines(self) -> AsyncIterator[bytes]:
        splitter = LineSplitter()
        size_at_start = _size(self._events)
        delay = _POLL_MIN_S
        watch = _DirWatch(self.run_dir, grows=self._events)
        # Whether the keeper may have written exit.json since the last look (at first: it may
        # be there already). Looking costs a failed open each time, so only when told.
        ended = True
        with (
            watch,
            # A local file, read without waiting; never through a link, nor another file than
            # the keeper's (tether.files.open_own).
            open_own(self._events) as f,
        ):
            f.seek(self.offset)
            while True:
                chunk = f.read(READ_CHUNK)
                if chunk:
                    self.offset += len(chunk)
                    delay = _POLL_MIN_S
                    for line in splitter.feed(chunk):
                        yield line
                    continue
                if self.offset >= size_at_start:
                    self.caught_up.set()
                if self._closed or (ended and self.exit_status is not None) or self._keeper_lost():
                    # The keeper writes exit.json after the last byte: one more read drains it.
                    rest = f.read()
                    if rest:
                        self.offset += len(rest)
                        for line in splitter.feed(rest):
                            yield line
                        continue
                    break
                if watch.fd is not None:
                    # Woken by the keeper's next write (or exit.json landing), not by a timer.
                    ended = await watch.wait(_WATCH_TIMEOUT_S, name=keeper.EXIT_NAME)
                else:
                    await anyio.sleep(delay)
                    delay = min(_POLL_MAX_S, delay * 2)
        self.caught_up.set()
        last = splitter.flush()
        if last is not None:
            yield last

    async def send(self, data: bytes) -> None:
        if self._closed or self._stdin_closed:
            raise TransportClosed("pi's command channel is closed")
        if not self.channel_ok():
            raise TransportClosed(f"pi's command FIFO {self._fifo} is missing")
        if self._before_send is not None:
            self._before_send(data)
        async with self._write_lock:
            try:
                await in_thread(self._write, data)
            except OSError as exc:
                raise TransportClosed(f"pi's command FIFO failed: {exc}") from exc

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            # The keeper holds the FIFO open, so a non-blocking open for writing succeeds at
            # once; a FIFO whose keeper is gone raises ENXIO here instead of blocking forever.
            fd = os.open(self._fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            found = os.fstat(fd)
            if not stat.S_ISFIFO(found.st_mode) or found.st_uid != os.geteuid():
                os.close(fd)  # not the keeper's FIFO (a tool's file in its place): no command
                raise OSError(f"{self._fifo} is not the keeper's command FIFO")
            self._fd = fd
            os.set_blocking(self._fd, True)
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def disown(self) -> None:
        """A newer owner holds the run: from now on nothing here signals pi or its keeper."""
        self._disowned = True

    def _signal(self, sig: signal.Signals) -> None:
        if self._disowned or not self.pi_alive():
            return  # gone, or the pid names another process now: never signal it
        keeper.signal_group(self.pid, sig)

    async def _wait_exit(self, seconds: float) -> bool:
        # Woken by exit.json landing (inotify), and looking at least every 50 ms: a keeper that
        # was killed writes none.
        with _DirWatch(self.run_dir) as watch, anyio.move_on_after(seconds):
            while self.exit_status is None:
                if not self.pi_alive() and not self._keeper_alive():
                    return True  # pi and its keeper are both gone (keeper killed too)
                if watch.fd is None:
                    await anyio.sleep(0.01)
                else:
                    await watch.wait(0.05)
            return True
        return self.exit_status is not None

    def _keeper_alive(self) -> bool:
        return alive(self.placement.get("keeper_pid"), self.placement.get("keeper_start"))

    def _knows_keeper(self) -> bool:
        return isinstance(self.placement.get("keeper_pid"), int) and isinstance(
            self.placement.get("keeper_start"), int | float
        )

    def _keeper_lost(self) -> bool:
        """The keeper is confirmed gone (by pid and start time) without recording pi's end:
        nothing relays commands to pi or its output to the events file any more. Looked at
        no more often than every ``_KEEPER_LOOK_S`` (a read of /proc)."""
        if self._lost is not None:
            return True
        now = time.monotonic()
        if now < self._next_keeper_look or not self._knows_keeper():
            return False
        self._next_keeper_look = now + _KEEPER_LOOK_S
        if self._keeper_alive() or self.exit_status is not None:
            return False
        self._lost = (
            f"pi's keeper (pid {self.placement.get('keeper_pid')}) died without recording "
            f"pi's end in {self.run_dir}"
        )
        return True

    def lost(self) -> str | None:
        return self._lost

    async def _kill_everything(self) -> None:
        if self._disowned:
            return
        if self.pi_alive():
            import psutil  # only on the way to a kill (8 ms of a run's start otherwise)

            strays = _descendants(self.pid)
            self._signal(signal.SIGKILL)
            for proc in strays:
                # psutil checks the pid still names the process it found (create time).
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        await self._wait_exit(self._grace)

    async def kill(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._kill_everything()

    async def _close_stdin(self) -> None:
        if self._stdin_closed:
            return
        with contextlib.suppress(TransportClosed):
            await self.send(keeper.CLOSE_STDIN + b"\n")
        self._stdin_closed = True

    async def aclose(self) -> None:
        if self._closed:
            return
        with anyio.CancelScope(shield=True):
            if not self._disowned and self._keeper_lost():
                # No keeper: no orderly close can reach pi, and no one else (no subreaper)
                # will end it or its tools. pi's tree found now is killed, and every process
                # of this run pi's death may have orphaned (a tool's own session).
                await self._kill_everything()
                await in_thread(_kill_run_strays, self.run_dir)
            elif not self._disowned:
                await self._close_stdin()
                if not await self._wait_exit(self._grace):
                    self._signal(signal.SIGTERM)
                    if not await self._wait_exit(self._grace):
                        await self._kill_everything()
            self._closed = True
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
            if self._keeper is not None and not self._disowned:
                # Our child: reap it once it is done (it writes exit.json just before).
                with anyio.move_on_after(self._grace):
                    while self._keeper.poll() is None:  # noqa: ASYNC110  (a Popen, no event)
                        await anyio.sleep(0.002)  # it exits right after writing exit.json


class _DirWatch:
    """inotify on the run directory, so the reader looks when something happens instead of on
    a timer (a timer's wake-ups cost CPU for the whole run). It wakes for a file landing in the
    directory (created or renamed into place: ``exit.json``) and, given ``grows``, for that
    one file growing (the events file), but not for the other files pi writes there as it works
    (its session file, its log): each wake-up is CPU taken from pi on a busy machine. ``fd`` is
    None when inotify is unavailable: the reader polls then.

    On asyncio the descriptor stays registered with the event loop from the first wait to the
    exit, and the loop's callback drains it and wakes the waiter: a run's events reader waits
    about 170 times in 20 turns, and registering the descriptor, a cancel scope and a drain to
    ``EAGAIN`` at every wait were a fifth of the harness's event-loop CPU. Another event loop
    (anyio's other backend) waits with ``wait_readable`` each time."""

    _IN_MODIFY = 0x002
    _IN_DONT_FOLLOW = 0x02000000
    _IN_MOVED_TO = 0x080
    _IN_CREATE = 0x100
    _IN_Q_OVERFLOW = 0x4000
    _IN_NONBLOCK = 0o4000
    _IN_CLOEXEC = 0o2000000
    _EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
    _READ = 64 * 1024  # far more than the events queued between two looks

    def __init__(self, directory: Path, *, grows: Path | None = None) -> None:
        self.fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # registered with, once waited on
        self._events: list[bytes] = []  # read by the loop's callback, not yet looked at
        self._waiter: asyncio.Future[None] | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(self._IN_NONBLOCK | self._IN_CLOEXEC)
            if fd < 0:
                return
            landing = self._IN_MOVED_TO | self._IN_CREATE
            followed = grows is not None and (
                libc.inotify_add_watch(
                    fd, os.fsencode(grows), self._IN_MODIFY | self._IN_DONT_FOLLOW
                )
                >= 0
            )
            # Without the file's own watch (it is not there yet), any change in the directory.
            mask = landing if followed or grows is None else landing | self._IN_MODIFY
            if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = None

    def __enter__(self) -> _DirWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:
            return
        if self._loop is not None:
            # Before the close: a number closed while still registered could name another file.
            # (A loop already closed has nothing registered.)
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                self._loop.remove_reader(self.fd)
            self._loop = None
        # Closing an inotify descriptor waits for the kernel's grace period (10-20 ms): done
        # off this thread, so that a run's end does not wait for it.
        threading.Thread(target=os.close, args=(self.fd,), daemon=True).start()
        self.fd = None

    def _readable(self) -> None:
        """The loop's callback: read what inotify holds (the descriptor is level-triggered, so
        it must be drained here) and wake the waiter."""
        assert self.fd is not None
        try:
            data = os.read(self.fd, self._READ)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # look anyway: the waiter finds out what is wrong
        self._events.append(data)
        if self._waiter is not None:
            _wake(self._waiter)

    async def wait(self, within: float, *, name: str | None = None) -> bool:
        """Wait until something happens, at most ``within`` seconds. True when the file
        ``name`` may have landed: it did, events were lost, or nothing came in time (look
        anyway); always True without a ``name``."""
        assert self.fd is not None
        if not self._events:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return await self._wait_readable(within, name)
            if self._loop is None:
                loop.add_reader(self.fd, self._readable)
                self._loop = loop
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(within, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._events:
                return True  # nothing came in time
        data = b"".join(self._events)
        self._events.clear()
        return name is None or not data or self._names(data, os.fsencode(name))

    async def _wait_readable(self, within: float, name: str | None) -> bool:
        assert self.fd is not None
        landed = True
        with anyio.move_on_after(within):
            await anyio.wait_readable(self.fd)
            landed = name is None
        wanted = None if name is None else os.fsencode(name)
        with contextlib.suppress(BlockingIOError, OSError):
            while data := os.read(self.fd, self._READ):
                if not landed and wanted is not None:
                    landed = self._names(data, wanted)
        return landed

    @classmethod
    def _names(cls, data: bytes, wanted: bytes) -> bool:
        """Whether the events in ``data`` name ``wanted`` (or the kernel dropped some)."""
        offset = 0
        while offset + cls._EVENT.size <= len(data):
            _, mask, _, size = cls._EVENT.unpack_from(data, offset)
            offset += cls._EVENT.size
            if mask & cls._IN_Q_OVERFLOW or data[offset : offset + size].rstrip(b"\0") == wanted:
                return True
            offset += size
        return False


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _size(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


def _kill_run_strays(run_dir: Path) -> None:
    """Kill the processes this run's pi started that are left: each one inherited pi's agent
    directory (``PI_CODING_AGENT_DIR``, inside the run directory), whoever its parent is now."""
    import psutil

    inside = str(run_dir.resolve()) + os.sep
    for proc in psutil.process_iter():
        try:
            if not proc.environ().get("PI_CODING_AGENT_DIR", "").startswith(inside):
                continue
            for each in [*proc.children(recursive=True), proc]:
                # psutil checks the pid still names the process it found (create time).
                with contextlib.suppress(psutil.Error):
                    each.kill()
        except psutil.Error:
            continue


def _descendants(root: int) -> list[psutil.Process]:
    import psutil

    try:
        return psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
