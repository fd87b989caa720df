"""``tether eval continuation``: what the next run knows after a checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tether.cli.common import ConfigOpt
from tether.cli.counts import counted
from tether.cli.exits import command, err_console
from tether.config import load_config
from tether.ids import check_id

__all__ = ["eval_app"]

eval_app = typer.Typer(help="Measure what the next run knows.", no_args_is_help=True)


COLUMNS = (
    "facts",
    "n",
    "avail",
    "summ",
    "anch",
    "req",
    "suffix",
    "notes",
    "recov",
    "a+r",
    "ans",
    "ans+rc",
)
"""The table's columns, explained in docs/cli.md (``tether eval continuation``)."""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def render(record: dict[str, Any], console: Console) -> None:
    """The record as tables for people (the columns are explained in docs/cli.md)."""
    anchors = (
        f"on, {counted(record['anchors_max_bytes'], 'byte', thousands=True)}"
        if record["anchors"]
        else "off"
    )
    console.print(
        f"tether eval continuation · {record['provider']} / {record['model']} · "
        f"pi {record['pi_version']} · {record['revision']} · {record['prompt_version']}\n"
        f"budget {counted(record['budget'], 'byte', thousands=True)} · anchors "
        f"{anchors}"
        f" · {counted(record['seeds'], 'seed')} × {counted(record['runs'], 'run')}",
        markup=False,
        highlight=False,
    )
    # Compact, so that it fits 80 columns.
    table = Table(title="after the first checkpoint", box=None, padding=(0, 1, 0, 0))
    for name in COLUMNS:
        if name == "facts":
            table.add_column(name, no_wrap=True, min_width=11)
        else:
            table.add_column(name, justify="right", no_wrap=True)
    rows = [("identifiers", record["identifiers"]), ("all facts", record["all"])]
    rows += list(record["kinds"].items())
    for name, row in rows:
        parts = row["by_part"]
        table.add_row(
            name,
            str(row["facts"]),
            _pct(row["available"]),
            *(_pct(parts[p]) for p in ("summary", "anchors", "request", "suffix", "notes")),
            _pct(row["recoverable"]),
            _pct(row["available_or_recoverable"]),
            _pct(row["answered_without_recall"]),
            _pct(row["answered_with_recall"]),
        )
    console.print(table)
    decay = Table(title="decay: the first run's facts after each checkpoint")
    for name in ("checkpoint", "identifiers available", "avail.+recov.", "all facts available"):
        decay.add_column(name, justify="right")
    for d in record["decay"]:
        decay.add_row(
            str(d["checkpoint"]),
            _pct(d["identifiers_available"]),
            _pct(d["identifiers_available_or_recoverable"]),
            _pct(d["all_available"]),
        )
    console.print(decay)
    parts = ", ".join(f"{k} {v:,}" for k, v in record["bytes_by_part"].items())
    console.print(f"view bytes (mean): {record['view_bytes']:,} ({parts})", markup=False)
    for problem in record["problems"]:
        console.print(f"! {problem}", style="yellow", markup=False)


@eval_app.command("continuation")
@command
def continuation(
    agent: Annotated[str, typer.Option("--agent", "-a", help="The agent to evaluate.")],
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Workspaces (seeds 1..N).")] = 5,
    runs: Annotated[
        int, typer.Option("--runs", min=1, help="Checkpoints in a row per seed (decay).")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
    no_anchors: Annotated[
        bool, typer.Option("--no-anchors", help="Checkpoints store no anchors (compare).")
    ] = False,
    no_probes: Annotated[
        bool, typer.Option("--no-probes", help="Skip the probe follow-ups (answered).")
    ] = False,
    scripted: Annotated[
        bool,
        typer.Option(
            "--scripted", help="The deterministic scripted model instead of the agent's provider."
        ),
    ] = False,
    budget: Annotated[
        int | None, typer.Option("--budget", min=1, help="Bytes (default: [followup] budget).")
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Workspaces, ledger and runs (default: .tether/eval)."),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus",
            help="Score real pi sessions (NAME.jsonl + NAME.facts.jsonl in DIR) with no model.",
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Measure what the next run knows after a continuation checkpoint.

    Real pi runs of AGENT (its provider and model) on generated workspaces with planted facts;
    each fact is scored, by exact match, as available in the next view (by part), recoverable
    with one recall call the view names, and answered by a follow-up (with and without recall).
    The evaluation keeps its own ledger in --dir: the configured ledger is not written.

    Example: tether eval continuation --agent reviewer --seeds 5 --runs 3 --json
    """
    from tether.eval import EvalOptions, evaluate

    check_id("agent", agent)
    cfg = load_config(config)
    if corpus is not None:
        from tether.eval.corpus import evaluate_corpus

        scored = evaluate_corpus(
            corpus,
            (directory or Path(".tether") / "eval-corpus").resolve(),
            agent=agent,
            budget=budget or cfg.followup.budget_bytes,
            anchors_max_bytes=0 if no_anchors else cfg.agent(agent).anchors_max_bytes,
        )
        sys.stdout.write(json.dumps(scored, ensure_ascii=False) + "\n")
        return
    options = EvalOptions(
        agent=agent,
        seeds=seeds,
        runs=runs,
        anchors=not no_anchors,
        probes=not no_probes,
        budget=budget,
        scripted=scripted,
        directory=directory,
    )
    with err_console.status("starting") as status:
        record = evaluate(cfg, options, lambda text: status.update(text))
    if as_json:
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        render(record, Console(highlight=False))
