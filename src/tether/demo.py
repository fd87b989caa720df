"""``make demo``: tether's main job on the embedded default, shown step by step.

This first part needs no model: it loads the bundled example session (a code review with tool
calls, a continuation checkpoint and a follow-up) into a fresh SQLite ledger, shows its timeline,
and shows what the next follow-up would be given.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

console = Console(highlight=False)

DEMO_DIR = Path(".tether") / "demo"


def tether(*args: str, check: bool = True) -> int:
    """Run the real CLI, as a user would, and show the command first."""
    console.print(f"[bold cyan]$ tether {' '.join(args)}[/]")
    proc = subprocess.run([sys.executable, "-m", "tether", *args], check=False)
    if check and proc.returncode != 0:
        console.print(f"[bold red]tether {args[0]} exited {proc.returncode}[/]")
        raise SystemExit(proc.returncode)
    return proc.returncode


def example_session() -> None:
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    db = DEMO_DIR / "example.db"
    for leftover in DEMO_DIR.glob("example.db*"):
        leftover.unlink()
    ledger = f"sqlite:{db}"
    config = DEMO_DIR / "example.toml"
    # ana may read acme's repositories: the rows and the checkpoint that carry repo:acme/api are
    # admitted to her follow-ups (without a grant they would be withheld, and named as gaps).
    config.write_text(
        f'[ledger]\nurl = "{ledger}"\n\n[access.grants]\n"user:ana" = ["repo:acme/*"]\n',
        encoding="utf-8",
    )
    example = resources.files("tether") / "examples" / "review.jsonl"
    with resources.as_file(example) as path:
        local = DEMO_DIR / "review.jsonl"
        shutil.copyfile(path, local)
    console.print(Rule("1. A bundled session, loaded into an embedded SQLite ledger"))
    tether("ledger", "load", str(local), "--config", str(config))
    console.print(Rule("2. Its timeline"))
    tether("log", "--session", "review-42", "--config", str(config))
    console.print(Rule("3. What the next follow-up of agent 'reviewer' would be given"))
    tether(
        "context",
        "--session",
        "review-42",
        "--agent",
        "reviewer",
        "--actor",
        "user:ana",
        "--request",
        "Now check src/metrics.py for the same race.",
        "--budget",
        "2500",
        "--config",
        str(config),
    )


def main() -> None:
    example_session()


if __name__ == "__main__":
    main()
