"""`tether …` for the service tests (a subprocess entry point; PYTHONPATH names the worktree)."""

from __future__ import annotations

from tether.cli.app import main

main()
