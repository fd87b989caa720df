"""pi interop: pi session files into the ledger and back.

    report = import_pi(ledger, "session.jsonl", session="s1", agent="reviewer", actor="user:ana")
    export_pi(ledger, "s1", out)      # a v3 pi session file pi opens and continues

Both stream: an import reads the file twice (the tree's shape first, then the bodies of the
active branch) and holds only the shape in memory; an export pages through the ledger.
"""

from __future__ import annotations

from tether.interop.pi_export import ExportReport, export_pi
from tether.interop.pi_import import ImportReport, LeftOut, import_pi, plan_import

__all__ = ["ExportReport", "ImportReport", "LeftOut", "export_pi", "import_pi", "plan_import"]
