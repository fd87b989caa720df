"""The generated workspace of ``tether eval continuation``: planted facts, seeded.

Every identifier derives from ``sha256("tether-eval/SEED/N")``, so no model can know it in
advance, and the same seed always plants the same facts. The facts appear only in what the
agent's tools read (files it opens, the output of commands it runs), except the decisions, which
the user states in the first request. Filler logs (plain text: no hex runs, no error lines, no
URLs) push each run's working view over the follow-up budget, so every run ends with a
continuation checkpoint.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.files import private_dir, private_file

__all__ = [
    "IDENTIFIER_KINDS",
    "PROMPT_VERSION",
    "Fact",
    "FactKind",
    "Step",
    "Workspace",
    "make_workspace",
]

PROMPT_VERSION = "eval-continuation/1"
"""Names the requests, probes and workspace layout below: change it when any of them changes, so
recorded figures compare only with figures of the same version."""

LOG_BYTES = 40_000
"""The largest filler log: under pi's tool-output cut (50 KB, 2,000 lines), so each is read
whole. Logs are a third of the budget when that is smaller (a small model's context window)."""

_MODULES = ("billing", "ingest", "search", "notify", "ledger", "export", "auth", "render")
_UNITS = ("ms", "MiB", "req/s", "s", "KiB")


class FactKind(enum.StrEnum):
    PATH = "path"
    SHA = "sha"
    COMMAND = "command"
    ERROR = "error"
    NUMBER = "number"
    DECISION = "decision"
    QUOTE = "quote"
    """A corpus fact (:mod:`tether.eval.corpus`): an exact quote from a real session."""


IDENTIFIER_KINDS = frozenset({FactKind.PATH, FactKind.SHA, FactKind.COMMAND, FactKind.ERROR})
"""The kinds anchors are for: exact identifiers a summary tends to lose."""


@dataclass(frozen=True)
class Fact:
    id: str
    kind: FactKind
    needle: str
    """The exact text that must reach the next view (scored verbatim)."""
    question: str
    """The probe's question; it never contains the needle."""
    answer: str
    """The exact answer a probe must give (scored by exact match, case and spaces as written)."""

    @property
    def expected(self) -> str:
        """The answer line that scores: a command's is the command and its exit status."""
        if self.kind is FactKind.COMMAND:
            return f"{self.needle} exited {self.answer}"
        return self.answer

    def answered_by(self, line: str) -> bool:
        """Whether a probe's answer line gives this fact exactly: the answer as a whole token (a
        digit inside another number does not count); for a command, the command too."""
        if self.kind is FactKind.COMMAND:
            if self.needle not in line:
                return False
            line = line.replace(self.needle, " ")
        return re.search(rf"(?<![\w.-]){re.escape(self.answer)}(?![\w-])", line) is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "needle": self.needle,
            "answer": self.answer,
        }


@dataclass(frozen=True)
class Step:
    """One tool call of the scripted agent's plan."""

    tool: str
    arguments: dict[str, Any]


@dataclass
class Workspace:
    seed: int
    root: Path
    facts: list[Fact]
    requests: list[str]
    """The request of each run, in order: run 1 plants the facts, the rest read more logs."""
    plans: list[list[Step]] = field(default_factory=list)
    """What the scripted agent does in each run (a real model chooses for itself)."""


def _h(seed: int, n: int) -> str:
    return hashlib.sha256(f"tether-eval/{seed}/{n}".encode()).hexdigest()


def _filler(name: str, log_bytes: int) -> str:
    # Plain words and small decimal numbers only: nothing an anchor or a fact looks like.
    lines, size, i = [], 0, 0
    while size < log_bytes:
        line = f"{name} step {i}: compiled unit {i % 97} of stage {i % 7} in {i % 50 + 3} ticks ok"
        lines.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    # Private like everything tether creates (the scripts run as `sh PATH`: no execute bit).
    private_dir(path.parent)
    private_file(path).write_text(text, encoding="utf-8")


def make_workspace(root: Path, seed: int, *, runs: int, budget: int) -> Workspace:
    """Write the workspace of ``seed`` under ``root`` and return its facts and requests."""
    private_dir(root)
    facts: list[Fact] = []
    plan1: list[Step] = []
    n = 0

    def h() -> str:
        nonlocal n
        n += 1
        return _h(seed, n)

    mods = list(_MODULES)
    # Paths, each file holding a number with its unit.
    for i in range(4):
        mod = mods[(seed + i) % len(mods)]
        x = h()
        path = f"src/{mod}_{x[:6]}/handler_{x[6:10]}.py"
        value = 1000 + int(x[10:14], 16) % 9000
        unit = _UNITS[int(x[14:16], 16) % len(_UNITS)]
        _write(
            root / path,
            f'"""The {mod} handler."""\n\n'
            f"# Measured limit of the {mod} handler: {value} {unit}\n"
            f"LIMIT = {value}\n\n\ndef handle(event):\n    return event\n",
        )
        facts.append(
            Fact(
                f"path-{i}",
                FactKind.PATH,
                path,
                f"What is the path of the {mod} handler file you read?",
                path,
            )
        )
        if i < 3:
            facts.append(
                Fact(
                    f"number-{i}",
                    FactKind.NUMBER,
                    f"{value} {unit}",
                    f"What measured limit does the {mod} handler state (number and unit)?",
                    f"{value} {unit}",
                )
            )
        plan1.append(Step("read", {"path": path}))
    # Commit SHAs in the release notes.
    releases = ["# Releases", ""]
    for i in range(3):
        x = h()
        version = f"v{i + 1}.{int(x[40:42], 16) % 20}.{int(x[42:44], 16) % 10}"
        releases.append(f"- release {version} was built from commit {x[:40]}")
        facts.append(
            Fact(
                f"sha-{i}",
                FactKind.SHA,
                x[:40],
                f"Which commit SHA was release {version} built from?",
                x[:40],
            )
        )
    _write(root / "RELEASES.md", "\n".join(releases) + "\n")
    plan1.append(Step("bash", {"command": "cat RELEASES.md"}))
    # Commands with their exit status, each printing the first line of an error.
    for i in range(3):
        x = h()
        name = f"scripts/check_{x[:6]}.sh"
        shard = int(x[6:8], 16) % 16
        status = 1 + int(x[8:10], 16) % 9
        error = f"ERROR E{x[10:16]}: migration {x[16:22]} failed on table t_{x[22:26]}"
        _write(
            root / name,
            f"#!/bin/sh\necho 'checking shard {shard}'\necho '{error}'\n"
            f"echo '  at step 3 of 7'\nexit {status}\n",
        )
        command = f"sh {name} --shard {shard}"
        facts.append(
            Fact(
                f"command-{i}",
                FactKind.COMMAND,
                command,
                f"Which command checked shard {shard}, and with what exit status did it end?",
                str(status),
            )
        )
        facts.append(
            Fact(
                f"error-{i}",
                FactKind.ERROR,
                error,
                f"What was the first line of the error the check of shard {shard} printed?",
                error,
            )
        )
        plan1.append(Step("bash", {"command": command}))
    # Decisions the user states in the first request.
    decisions = []
    for i in range(2):
        x = h()
        mod = mods[(seed + 4 + i) % len(mods)]
        shards = 2 + int(x[:2], 16) % 30
        ticket = f"T-{x[2:7]}"
        sentence = f"the {mod} cache keeps {shards} shards until ticket {ticket} lands"
        decisions.append(sentence)
        facts.append(
            Fact(
                f"decision-{i}",
                FactKind.DECISION,
                ticket,
                f"Until which ticket does the {mod} cache keep its shard count?",
                ticket,
            )
        )
    # Filler: enough logs per run for its working view to exceed the budget.
    log_bytes = max(500, min(LOG_BYTES, budget // 3))
    per_run = max(2, math.ceil(budget * 1.25 / log_bytes) + 1)
    plans: list[list[Step]] = []
    requests: list[str] = []
    for k in range(1, runs + 1):
        logs = []
        for j in range(per_run):
            log = f"logs/run{k}/build_{j}.log"
            _write(root / log, _filler(f"run{k}-log{j}", log_bytes))
            logs.append(Step("bash", {"command": f"cat {log}"}))
        if k == 1:
            plans.append(plan1 + logs)
            requests.append(
                f"[eval run {k}] Audit this repository. Read every handler under src/, the "
                "release notes (RELEASES.md), run every script under scripts/ (sh PATH --shard N, "
                f"the shard each one names), then read the build logs under logs/run{k}/. We "
                f"decided: {decisions[0]}; and {decisions[1]}. Report what you found."
            )
        else:
            plans.append(logs)
            requests.append(
                f"[eval run {k}] Continue the audit: read the build logs under logs/run{k}/ and "
                "say whether any step failed."
            )
    return Workspace(seed=seed, root=root, facts=facts, requests=requests, plans=plans)
