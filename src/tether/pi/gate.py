"""pi held at its start until its run is ready (docs/architecture.md#custody).

pi is started with a Node preload module (``extension/gate.ts``) that loads most of pi's runtime
and then waits on a pipe before pi's entry runs. The harness starts pi as soon as a request is
admitted and lets it through (:meth:`Gate.release`) once the session file pi opens is written:
pi's start, the largest fixed cost of a run, overlaps the harness's own. Closing the gate
without releasing it (:meth:`Gate.close`, or the harness dying) ends pi with
:data:`WITHDRAWN_STATUS` before it has read or written anything.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from tether.pi.install import extension_file

__all__ = ["GATE_FD_ENV", "GATE_MODULE", "WITHDRAWN_STATUS", "Gate"]

GATE_FD_ENV = "TETHER_GATE_FD"
GATE_MODULE = extension_file("gate")
WITHDRAWN_STATUS = 75
"""pi's exit status when its run was withdrawn at the gate."""


class Gate:
    """One pi's gate: a pipe whose read end pi inherits (through the keeper)."""

    def __init__(self) -> None:
        self._read: int | None
        self._write: int | None
        self._read, self._write = os.pipe()
        self.released = False
        """Whether pi was let through (else it ends at the gate once the gate is closed)."""

    @property
    def env(self) -> dict[str, str]:
        """What pi's environment needs: the descriptor's number."""
        assert self._read is not None, "the gate's read end is already handed over"
        return {GATE_FD_ENV: str(self._read)}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self._read is None else (self._read,)

    @staticmethod
    def argv(argv: Sequence[str]) -> list[str]:
        """pi's command line (node first) with the gate preloaded."""
        return [argv[0], "--import", GATE_MODULE.as_uri(), *argv[1:]]

    def handed_over(self) -> None:
        """pi (or its keeper) has the read end now: close this process's copy, so that this
        process's end, or :meth:`close`, is pi's end of file."""
        if self._read is not None:
            with contextlib.suppress(OSError):
                os.close(self._read)
            self._read = None

    def release(self) -> None:
        """Let pi through: its session file is written. From now on pi is the transport's to
        watch: a pi that already died (the write fails) is found dead there."""
        if self._write is None:
            return
        self.released = True
        with contextlib.suppress(OSError):
            os.write(self._write, b"\n")
        self.close()

    def close(self) -> None:
        """Close the gate for good; a pi still waiting at it ends (:data:`WITHDRAWN_STATUS`)."""
        self.handed_over()
        if self._write is not None:
            with contextlib.suppress(OSError):
                os.close(self._write)
            self._write = None
