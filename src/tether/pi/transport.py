"""The seam between the harness and pi: a byte-line transport.

``AgentTransport`` is what the RPC client talks to; tests may replace it. ``SubprocessTransport``
runs pi as a child process in its own process group, talks over stdin/stdout, and copies stderr
into the run's log (pi's diagnostics, never parsed as protocol).

Closing is a shielded escalation that always reaps the child:

    close stdin (pi's orderly shutdown)  → grace
    SIGTERM to the process group         → grace
    SIGKILL to the process group and to every descendant found at that moment

Signals go to the group only while the child has not been reaped: a reaped pid (and so its
group id) may belong to a replacement process, which cleanup must never touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

from tether.files import private_file
from tether.pi import keeper
from tether.pi.errors import PiStartupFailed, TransportClosed
from tether.pi.jsonl import LineSplitter
from tether.processes import start_time

if TYPE_CHECKING:
    import psutil

__all__ = ["AgentTransport", "SubprocessTransport"]

READ_CHUNK = 256 * 1024
STDERR_TAIL_LINES = 40


class AgentTransport(Protocol):
    """Lines in, lines out, and a way to stop the other side."""

    def lines(self) -> AsyncIterator[bytes]:
        """Each stdout line (without its newline) until the stream ends."""
        ...

    async def send(self, data: bytes) -> None:
        """Write bytes (one or more complete lines). Raises ``TransportClosed``."""
        ...

    async def aclose(self) -> None:
        """Stop the agent (escalating) and release everything. Idempotent; never raises."""
        ...

    async def kill(self) -> None:
        """Stop the agent at once (hard stop). Idempotent; never raises."""
        ...

    @property
    def exit_status(self) -> int | None:
        """The agent's exit status once it has exited, else None."""
        ...

    def diagnostics(self) -> str:
        """The last lines the agent wrote to stderr (for error messages)."""
        ...

    @property
    def pid(self) -> int:
        """The agent's process id."""
        ...

    def pi_placement(self) -> dict[str, Any]:
        """Where the agent runs, for the run's lease: ``pi_pid`` and ``pi_start`` (and its
        keeper's, when it has one)."""
        ...

    def channel_ok(self) -> bool:
        """Commands can still reach the agent (a keeper's FIFO can be removed under it)."""
        ...

    async def fenced_out(self) -> None:
        """A newer owner holds the run: leave the agent to it when it can be taken over, or
        else stop it at once. Never raises."""
        ...

    def lost(self) -> str | None:
        """Why the transport was lost beyond recovery (a keeper that died: no command channel,
        no events, no record of pi's end), or None."""
        ...


def _descendants(root: int) -> list[psutil.Process]:
    """Every live descendant of ``root``, found now (pi starts tool shells in groups of their
    own, so the group signal alone does not reach them). psutil is imported here, on the
    way to a kill, not by every run (8 ms of a run's start)."""
    import psutil

    try:
        return psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []


class SubprocessTransport:
    """pi as a child process. Use ``async with SubprocessTransport.open(...) as t``."""

    def __init__(
        self,
        process: anyio.abc.Process,
        stderr_log: IO[bytes],
        *,
        grace_s: float,
    ) -> None:
        self._process = process
        self._log = stderr_log
        self._grace = grace_s
        self._tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._closed = False
        self._stdin_closed = False
        self._write_lock = anyio.Lock()
        self._stderr_done = anyio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        stderr_log: Path,
        grace_s: float = 3.0,
        pass_fds: Sequence[int] = (),
    ) -> AsyncIterator[SubprocessTransport]:
        log = private_file(stderr_log).open("ab")
        try:
            process = await anyio.open_process(
                list(argv),
                env=dict(env),
                cwd=str(cwd),
                start_new_session=True,  # its own process group, so the stop reaches its children
                pass_fds=pass_fds,
            )
        except OSError as exc:
            log.close()
            raise PiStartupFailed(f"cannot start {argv[0]}: {exc}") from exc
        transport = cls(process, log, grace_s=grace_s)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(transport._pump_stderr)
                try:
                    yield transport
                finally:
                    await transport.aclose()
        except BaseExceptionGroup as group:
            # The stderr pump never raises: a group holds the caller's own exception.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            log.close()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def exit_status(self) -> int | None:
        return self._process.returncode

    def diagnostics(self) -> str:
        return "\n".join(self._tail)

    def pi_placement(self) -> dict[str, Any]:
        return {"pi_pid": self.pid, "pi_start": start_time(self.pid)}

    def channel_ok(self) -> bool:
        return not self._stdin_closed and not self._closed

    async def fenced_out(self) -> None:
        # pi is this harness's child and ends with it: nothing a newer owner could take over.
        await self.kill()

    def lost(self) -> str | None:
        return None  # pi's own pipes: its end is always seen (and reaped)

    async def _pump_stderr(self) -> None:
        stream = self._process.stderr
        try:
            if stream is None:
                return
            splitter = LineSplitter()
            with contextlib.suppress(
                anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                while True:
                    chunk = await stream.receive(READ_CHUNK)
                    self._log.write(chunk)
                    self._log.flush()
                    for line in splitter.feed(chunk):
                        if line.strip():
                            self._tail.append(line.decode("utf-8", "replace"))
            rest = splitter.flush()
            if rest and rest.strip():
                self._tail.append(rest.decode("utf-8", "replace"))
        finally:
            self._stderr_done.set()

    async def lines(self) -> AsyncIterator[bytes]:
        stream = self._process.stdout
        if stream is None:
            return
        splitter = LineSplitter()
        while True:
            try:
                chunk = await stream.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
            for line in splitter.feed(chunk):
                yield line
        rest = splitter.flush()
        if rest is not None:
            yield rest

    async def send(self, data: bytes) -> None:
        stdin = self._process.stdin
        if stdin is None or self._stdin_closed or self._closed:
            raise TransportClosed("pi's stdin is closed")
        try:
            async with self._write_lock:
                await stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            raise TransportClosed(f"pi's stdin closed: {exc}") from exc

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._process.returncode is not None:
            return  # reaped: the pid may be someone else's now
        keeper.signal_group(self._process.pid, sig)

    async def _close_stdin(self) -> None:
        if self._stdin_closed or self._process.stdin is None:
            return
        self._stdin_closed = True
        with contextlib.suppress(Exception):
            await self._process.stdin.aclose()

    async def _wait(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            await self._process.wait()
            return True
        return self._process.returncode is not None

    async def _kill_everything(self) -> None:
        if self._process.returncode is None:
            import psutil  # loaded by _descendants already

            strays = _descendants(self._process.pid)
            self._signal_group(signal.SIGKILL)
            for proc in strays:
                # psutil checks the pid still names the process it found (create time).
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        await self._process.wait()

    async def kill(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._close_stdin()
            await self._kill_everything()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._close_stdin()
            if not await self._wait(self._grace):
                self._signal_group(signal.SIGTERM)
                if not await self._wait(self._grace):
                    await self._kill_everything()
            await self._process.wait()  # always reap
            # Let the stderr copy drain, unless a stray child still holds the pipe open.
            with anyio.move_on_after(1.0):
                await self._stderr_done.wait()
            for stream in (self._process.stdout, self._process.stderr):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.aclose()
            # anyio's streams closed leave asyncio's pipes open while a stray child still
            # holds pi's stdout or stderr: their descriptors stayed open until the garbage
            # collector took them, after the event loop had closed (an unraisable error).
            transport = getattr(getattr(self._process, "_process", None), "_transport", None)
            if isinstance(transport, asyncio.BaseTransport):
                transport.close()
