"""`tether …` for the service tests (a subprocess entry point)."""

from __future__ import annotations

import custody_standin

custody_standin.install()

from tether.cli.app import main  # noqa: E402

main()
