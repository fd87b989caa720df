"""What tether's harness and its continuation extension (``extension/continuation.ts``, running
inside pi) agree on: the marker the harness sends as ``compact``'s custom instructions, the kind
of the refusal receipt the extension sends back, and the command that shows it is loaded.

Python is the source: ``continuation.ts`` writes the same values (pi loads the extension as a
compiled module, and reading them from a file would cost every pi start), and
``tests/test_continuation_contract.py`` loads the compiled extension in Node and fails when any
differs, the refusal reasons (``tether.ledger.ReceiptReason``) included.
"""

from __future__ import annotations

__all__ = ["MARKER_TAG", "MARKER_VERSION", "PRESENCE_COMMAND", "PRESENCE_KIND", "RECEIPT_KIND"]

MARKER_TAG = "continuation"
"""The marker's ``tether`` field: the compaction is tether's continuation checkpoint."""
MARKER_VERSION = 1
RECEIPT_KIND = "continuation_checkpoint_refused"
PRESENCE_COMMAND = "tether-continuation"
"""The command the extension registers so ``get_commands`` shows it is loaded."""
PRESENCE_KIND = "continuation_extension"
"""The ``kind`` of the notice the presence command sends when it is run."""
