"""Showing a follow-up view to a person (`tether context`): what the model will see, and what
was left out. Presentation (rich) lives here, in the CLI, not in the functional core."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether.cli.counts import counted
from tether.followup.view import FollowupView, GapWhy, Refusal, ViewMessage

__all__ = ["render_refusal", "render_view"]

_WIDTH = 160  # characters of content shown per message
# Withheld rows exist but are not the reader's; erased ones exist no more; the rest did not fit.
_GAP_STYLE = {GapWhy.WITHHELD: "magenta", GapWhy.ERASED: "yellow"}


def _text_of(message: dict[str, Any]) -> str:
    role = message.get("role")
    if role == "bashExecution":
        return f"$ {message.get('command', '')}\n{message.get('output', '')}"
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "toolCall":
                args = json.dumps(block.get("arguments"), ensure_ascii=False)
                parts.append(f"→ {block.get('name')}({args})")
            elif kind == "image":
                parts.append(f"[{block.get('mimeType', 'image')}]")
            elif kind == "thinking":
                parts.append("(thinking)")
    return " ".join(parts)


def _short(text: str, width: int = _WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def _flag(m: ViewMessage) -> Text:
    if m.synthetic:
        return Text("synthetic", style="cyan")
    if m.copied:
        return Text("copied" + (" (changed)" if m.modified else ""), style="yellow")
    return Text("reused", style="green")


def render_view(view: FollowupView, console: Console) -> None:
    share = view.bytes / view.budget if view.budget else 0.0
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    # Everything shown comes from the ledger: never let it be read as rich markup.
    head.add_row("session", Text(f"{view.session}  agent {view.agent}  actor {view.actor or '-'}"))
    head.add_row(
        "bytes", f"{view.bytes:,} of {view.budget:,} ({share:.0%}); media {view.media_bytes:,}"
    )
    if view.checkpoint:
        cp = view.checkpoint
        kind = "continuation checkpoint" if cp.continuation else "pi compaction"
        head.add_row(
            "checkpoint",
            Text(
                f"{kind} at row {cp.seq} by run {cp.run}, covers rows ≤ {cp.covers_to} "
                f"({counted(cp.bytes, 'byte', thousands=True)} quoted)"
            ),
        )
        if cp.anchors:
            head.add_row(
                "anchors",
                Text(
                    f"{counted(len(cp.anchors), 'identifier')} from rows ≤ {cp.covers_to} "
                    f"({counted(cp.anchors_bytes, 'byte', thousands=True)} quoted)"
                ),
            )
    else:
        head.add_row("checkpoint", "none")
    if view.previous_request:
        pr = view.previous_request
        head.add_row(
            "previous request",
            Text(f"row {pr.seq} of run {pr.run} by {pr.actor} ({pr.mode.value})"),
        )
    else:
        head.add_row("previous request", "none")
    gaps = ", ".join(
        f"[{_GAP_STYLE.get(g.why, 'red')}]{_span(g.first, g.last)} {g.why.value}[/]"
        for g in view.gaps
    )
    head.add_row("gaps", gaps or "none")
    if view.sources:
        head.add_row("sources", Text(", ".join(view.sources)))

    table = Table(expand=True, show_lines=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("row", justify="right")
    table.add_column("actor")
    table.add_column("role")
    table.add_column("bytes", justify="right")
    table.add_column("kept as")
    table.add_column("content", ratio=1, overflow="fold")
    for i, m in enumerate(view.messages, start=1):
        table.add_row(
            str(i),
            str(m.origin) if m.origin is not None else "",
            Text(m.actor),
            m.role,
            f"{m.bytes:,}",
            _flag(m),
            Text(_short(_text_of(m.message))),
        )
    if view.request is not None:
        table.add_row(
            "→",
            "",
            Text(view.request.actor),
            "user",
            f"({view.request.bytes:,})",
            Text("new request", style="bold"),
            Text(_short(_text_of(view.request.message))),
        )
    console.print(Panel(Group(head, table), title="follow-up view", expand=True))


def render_refusal(refusal: Refusal, console: Console) -> None:
    console.print(
        Text(f"refused ({refusal.reason.value}): ", style="bold red") + Text(refusal.detail)
    )
