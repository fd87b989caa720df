"""The harness's part of the error tree (all are :class:`tether.errors.HarnessError`).

HarnessError
├── PiNotInstalled     the pinned pi or Node 22 is missing (run ``make install``)
├── PiStartupFailed    pi exited or failed before it took the prompt
├── TransportClosed    pi's stdio closed (the process died or was stopped)
└── ProtocolError      pi answered out of protocol (a rejected command, a bad record)
    └── BadLine        a line of pi's output that is not a protocol record (also a ValueError)
"""

from __future__ import annotations

from tether.errors import HarnessError

__all__ = ["BadLine", "PiNotInstalled", "PiStartupFailed", "ProtocolError", "TransportClosed"]


class PiNotInstalled(HarnessError):
    """The pinned pi or its Node 22 runtime is not where tether looks for it."""


class PiStartupFailed(HarnessError):
    """pi exited, or refused the prompt, before a run started."""


class TransportClosed(HarnessError):
    """pi's stdio closed: the process exited, was killed, or the harness closed it."""


class ProtocolError(HarnessError):
    """pi sent something the harness cannot use, or rejected a command."""


class BadLine(ProtocolError, ValueError):
    """A line of pi's output is not a protocol record: not UTF-8, not JSON, not an object, or
    beyond what JSON should carry (nesting, number size, line length). A ``ValueError`` too, so
    readers that treat such lines as stray output keep doing so."""
