"""What tether's harness and its continuation extension (``extension/continuation.ts``, running
inside pi) agree on: the marker the harness sends as ``compact``'s custom instructions, the kind
of the refusal receipt the extension sends back, the command that shows it is loaded, and how the
checkpoint it writes proves it is the run's (the run's nonce, given in pi's environment, keys an
HMAC of the summary in the marker the extension stores; docs/security.md, "Rows only from pi").

Python is the source: ``continuation.ts`` writes the same values (pi loads the extension as a
compiled module, and reading them from a file would cost every pi start), and
``tests/test_continuation_contract.py`` loads the compiled extension in Node and fails when any
differs, the refusal reasons (``tether.ledger.ReceiptReason``) included.
"""

from __future__ import annotations

import base64
import os
from typing import Any

__all__ = [
    "MAC_DOMAIN",
    "MAC_FIELD",
    "MARKER_TAG",
    "MARKER_VERSION",
    "NONCE_ENV",
    "PRESENCE_COMMAND",
    "PRESENCE_KIND",
    "RECEIPT_KIND",
]

MARKER_TAG = "continuation"
"""The marker's ``tether`` field: the compaction is tether's continuation checkpoint."""
MARKER_VERSION = 1
RECEIPT_KIND = "continuation_checkpoint_refused"
PRESENCE_COMMAND = "tether-continuation"
"""The command the extension registers so ``get_commands`` shows it is loaded."""
PRESENCE_KIND = "continuation_extension"
"""The ``kind`` of the notice the presence command sends when it is run."""

NONCE_ENV = "TETHER_CONTINUATION_NONCE"
"""The run's nonce, in pi's environment: the extension reads it at load and removes it from
``process.env``, so the processes pi's tools start never inherit it."""
MAC_FIELD = "mac"
"""The field of the compaction's continuation marker (``details.continuation``) that proves the
extension wrote it for this run: :func:`checkpoint_mac` of the run's nonce."""
MAC_DOMAIN = "tether-continuation"
"""What the signed text starts with, so the run's nonce signs nothing else by mistake."""


def new_nonce() -> str:
    """A run's nonce: 32 random bytes, base64url (``secrets.token_urlsafe(32)``, spelled out:
    importing secrets would delay the start of pi, which is made right after this)."""
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


def checkpoint_mac(nonce: str, run: str, summary: str) -> str:
    """HMAC-SHA256, keyed by the run's nonce, of the run id and the summary (hex): what the
    extension puts in the marker of the checkpoint it writes. The nonce itself is written
    nowhere a tool could read it back (not in the session file, not in pi's events)."""
    import hashlib
    import hmac

    text = "\0".join((MAC_DOMAIN, run, summary)).encode("utf-8")
    return hmac.new(nonce.encode("utf-8"), text, hashlib.sha256).hexdigest()


def proven(marker: Any, *, nonce: str, run: str, summary: Any) -> bool:
    """Whether a compaction's continuation ``marker`` was written by the extension of the run
    whose nonce is ``nonce`` (and whose id is ``run``) for this ``summary``."""
    import hmac

    if not isinstance(marker, dict) or marker.get("run") != run or not isinstance(summary, str):
        return False
    mac = marker.get(MAC_FIELD)
    if not isinstance(mac, str):
        return False
    return hmac.compare_digest(mac, checkpoint_mac(nonce, run, summary))
