"""``make demo``: tether's main job on the embedded default, shown step by step.

The live part runs a real pi agent on a real (small) model with no account, key or network: it
starts the embedded model server (SmolLM2-135M on llama.cpp, from the ``local`` extra), writes a
config with a follow-up budget small enough that a continuation checkpoint is due after a couple
of requests (its agent sandboxed, as every agent is by default: pi runs in bubblewrap and reaches
the model server only through tether's provider forwarder outside the sandbox), sends follow-ups
through ``tether run`` until a checkpoint is written (or refused, with its receipt and the
reason its run's record gives), shows the session's timeline and the view the next follow-up
would get, and stops the server. It exits 0 once it has shown a checkpoint or a refusal receipt,
2 when bubblewrap cannot start a sandbox here.

``python -m tether.demo --example`` shows the bundled example session instead (no model needed):
a code review with tool calls, a continuation checkpoint and a follow-up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.rule import Rule
from rich.syntax import Syntax
from rich.text import Text

from tether.config import Config, SandboxKind
from tether.errors import ModelError
from tether.files import private_dir, private_file
from tether.ledger import ReceiptReason, open_ledger
from tether.model import server_available, stop_recorded, write_local_config
from tether.model.process import read_state
from tether.sandbox.bwrap import probe

console = Console(highlight=False)

DEMO_DIR = Path(".tether") / "demo"


def tether(*args: str, check: bool = True, ok: tuple[int, ...] = (0,)) -> int:
    """Run the real CLI, as a user would, and show the command first. With ``check``, an exit
    status outside ``ok`` ends the demo with that status."""
    console.print(f"[bold cyan]$ tether {escape(' '.join(args))}[/]")
    proc = subprocess.run([sys.executable, "-m", "tether", *args], check=False)
    if check and proc.returncode not in ok:
        console.print(f"[bold red]tether {args[0]} exited {proc.returncode}[/]")
        raise SystemExit(proc.returncode)
    return proc.returncode


def example_session() -> None:
    private_dir(DEMO_DIR)
    db = DEMO_DIR / "example.db"
    for leftover in DEMO_DIR.glob("example.db*"):
        leftover.unlink()
    ledger = f"sqlite:{db}"
    config = DEMO_DIR / "example.toml"
    # ana may read acme's repositories: the rows and the checkpoint that carry repo:acme/api are
    # admitted to her follow-ups (without a grant they would be withheld, and named as gaps).
    private_file(config).write_text(
        f'[ledger]\nurl = "{ledger}"\n\n[access.grants]\n"user:ana" = ["repo:acme/*"]\n',
        encoding="utf-8",
    )
    example = resources.files("tether") / "examples" / "review.jsonl"
    with resources.as_file(example) as path:
        local = DEMO_DIR / "review.jsonl"
        shutil.copyfile(path, private_file(local))
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


LIVE_DIR = DEMO_DIR / "live"
LIVE_SESSION = "demo"
LIVE_AGENT = "assistant"
LIVE_ACTOR = "user:ana"
LIVE_BUDGET = 6_000
"""Bytes a follow-up may read: pi's system message (its prompt and tool declarations, about
2 KB) and two or three exchanges with this model, so a checkpoint is due soon, once pi has
more than one exchange to summarize (it refuses to compact a session of one: "Nothing to
compact")."""
LIVE_REQUESTS = [
    "I am writing inventory.py with a function add_item(stock, name, qty) that adds qty of name "
    "to the dict stock. What should it check first?",
    "Should add_item raise ValueError or return False when qty is negative? Pick one.",
    "Suggest a name and a signature for the function that removes items.",
    "Write a one-line docstring for add_item.",
    "Which two tests would you write first?",
]
NEXT_REQUEST = "Remind me: what did we decide about negative quantities?"


def _sandbox_line(loaded: Config, base_url: str) -> str | None:
    """What confines the agent's pi, as the config says and this host allows; None when
    bubblewrap cannot start here (the runs would be refused: the caller says so and stops)."""
    agent = loaded.agents[LIVE_AGENT]
    if agent.sandbox is SandboxKind.NONE:
        return f'[bold yellow]pi runs UNCONFINED[/] (sandbox = "none"): {escape(base_url)} direct'
    if (problem := probe()) is not None:
        console.print(
            f"[bold red]bubblewrap cannot start a sandbox here:[/] {escape(problem)}\n"
            "install it (`make install` does, as root; Debian: `apt-get install bubblewrap`) and "
            "allow unprivileged user namespaces, then `make demo` again (docs/security.md)"
        )
        return None
    return (
        f'pi runs in bubblewrap (sandbox = "bwrap", network = "{agent.network.value}"): its '
        "models.json points at a relay inside the sandbox, and tether's forwarder outside it "
        f"reaches the model server at {escape(base_url)}"
    )


REFUSAL_MEANING = {
    ReceiptReason.CANCELLED: "the checkpoint was called off",
    ReceiptReason.TRUNCATED: "the model's summary reached its token limit (stop reason length)",
    ReceiptReason.EMPTY: "the model's summary was empty",
    ReceiptReason.OVER_BOUND: "the model's summary was over summary_max_bytes",
    ReceiptReason.PROVIDER_FAILURE: "the summary request to the model failed",
}
"""What each refusal reason means; the harness records a ``checkpoint_detail`` only when it
refused itself, so a refusal of the model's summary is explained from its reason."""


def _refusal_why(config: Config, run: str, outcome: str) -> str:
    """Why the run's checkpoint was refused: its record's detail, else what its reason means."""
    with open_ledger(config.ledger.url) as ledger:
        record = ledger.run(run)
    detail = record.extra.get("checkpoint_detail") if record is not None else None
    if detail:
        return str(detail)
    return REFUSAL_MEANING[ReceiptReason(outcome.removeprefix("refused:"))]


def _run_follow_up(config: Path, request: str) -> dict[str, object]:
    args = ["run", "--config", str(config), "--session", LIVE_SESSION, "--agent", LIVE_AGENT]
    args += ["--actor", LIVE_ACTOR, "--json", request]
    console.print(f"[bold cyan]$ tether {' '.join(args[:-1])} {json.dumps(request)}[/]")
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tether", *args], capture_output=True, text=True, check=False
    )
    # Exit 3 with a JSON result: the run finished and its continuation checkpoint was refused.
    if proc.returncode not in (0, 3) or not proc.stdout.strip():
        console.print(proc.stderr.strip() or proc.stdout.strip(), markup=False)
        console.print(f"[bold red]tether run exited {proc.returncode}[/]")
        raise SystemExit(proc.returncode or 1)
    result: dict[str, object] = json.loads(proc.stdout)
    console.print(
        Panel(
            # The model's text is shown as is, never read as markup.
            Text(str(result["answer"]).strip() or "(empty answer)"),
            title=f"answer · run {result['run']} · {time.monotonic() - began:.1f}s",
            title_align="left",
            subtitle=f"checkpoint: {result['checkpoint']}",
            subtitle_align="left",
        )
    )
    return result


def live_session() -> int:
    if not server_available():
        console.print(
            "[bold red]the local model is not installed:[/] run `make local` (the one-time "
            "llama.cpp build takes about 6 minutes on 2 cores), then `make demo` again"
        )
        return 2
    began = time.monotonic()
    shutil.rmtree(LIVE_DIR, ignore_errors=True)
    private_dir(LIVE_DIR)
    state = DEMO_DIR / "model"
    stop_recorded(state)  # a server left behind by an interrupted demo
    console.print(Rule("1. Start the embedded model (SmolLM2-135M on llama.cpp, on 127.0.0.1)"))
    tether("model", "serve", "--background", "--state-dir", str(state))
    try:
        server = read_state(state)
        if server is None:
            raise ModelError(f"`tether model serve` recorded no server in {state}")
        config = LIVE_DIR / "tether.toml"
        loaded = write_local_config(
            config,
            server.base_url,
            ledger_url=f"sqlite:{LIVE_DIR / 'ledger.db'}",
            budget_bytes=LIVE_BUDGET,
            agent=LIVE_AGENT,
            max_tokens=192,
            deadline_s=300,
            summary_max_bytes=1_200,
        )
        console.print(Rule(f"2. A config for it ({config}), follow-up budget {LIVE_BUDGET} bytes"))
        console.print(Syntax(config.read_text(encoding="utf-8").strip(), "toml", word_wrap=True))
        sandbox = _sandbox_line(loaded, server.base_url)
        if sandbox is None:
            return 2
        console.print(sandbox)
        console.print(f"[dim]set-up took {time.monotonic() - began:.1f}s[/]")
        console.print(Rule("3. Follow-ups on one session, each a real pi run through tether"))
        outcome, detail = "not_needed", ""
        for request in LIVE_REQUESTS:
            result = _run_follow_up(config, request)
            outcome = str(result["checkpoint"])
            if outcome.startswith("refused:"):
                detail = _refusal_why(loaded, str(result["run"]), outcome)
                console.print(Text(f"why: {detail}", style="yellow"))
            if outcome != "not_needed":
                break
        console.print(Rule("4. The session's timeline: requests, answers, and the checkpoint"))
        tether("log", "--session", LIVE_SESSION, "--config", str(config))
        console.print(Rule("5. What the next follow-up would be given"))
        # A refused view (exit 3) is an answer too: it says why, and the demo goes on.
        tether(
            "context",
            "--session",
            LIVE_SESSION,
            "--agent",
            LIVE_AGENT,
            "--actor",
            LIVE_ACTOR,
            "--request",
            NEXT_REQUEST,
            "--config",
            str(config),
            ok=(0, 3),
        )
    finally:
        console.print(Rule("6. Stop the model server"))
        tether("model", "stop", "--state-dir", str(state), check=False)
    if outcome == "written":
        console.print(
            "[bold green]A continuation checkpoint was written[/] and the next follow-up reads it "
            "directly, with the exact previous request and the recent exchanges that fit."
        )
        return 0
    if outcome.startswith("refused:"):
        console.print(
            f"[bold yellow]The checkpoint was refused ({outcome.removeprefix('refused:')})[/]: no "
            f"summary was stored ({escape(detail)}); the receipt is in the timeline, and the next "
            "follow-up falls back to the exact previous request and the recent exchanges."
        )
        return 0
    console.print("[bold red]No checkpoint was due[/]: the working view never exceeded the budget.")
    return 1


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "--example" in args:
        example_session()
        return
    raise SystemExit(live_session())


if __name__ == "__main__":
    main()
