"""``tether eval continuation``: what the next run knows after a checkpoint
(docs/cli.md#tether-eval-continuation).

For each seed: a generated workspace (:mod:`tether.eval.workspace`), a session in a ledger of the
evaluation's own (SQLite, in its directory: the evaluation never writes the configured ledger),
and K real pi runs in a row through the real harness, each ending with a continuation checkpoint.
After each run the next view is built exactly as the next run would get it (the same actor and
grants) and the first run's facts are scored against it (:mod:`tether.eval.score`): that is the
decay. After the first run, probes (one follow-up asking every fact's question) run as real
follow-ups on copies of the session, once with recall and once without, scored by exact match.

The record names the revision, pi's version, the provider, the model, the prompt version and
the budget, so that figures compare.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from tether.admission import Refused
from tether.config import (
    AccessConfig,
    AgentConfig,
    Config,
    LedgerConfig,
    ProviderConfig,
)
from tether.errors import ConfigError
from tether.eval.score import Part, ViewScore, score_view, share, text_of
from tether.eval.scripted import MODEL, ScriptedModel
from tether.eval.workspace import (
    IDENTIFIER_KINDS,
    PROMPT_VERSION,
    Fact,
    FactKind,
    Workspace,
    make_workspace,
)
from tether.files import private_dir
from tether.followup import FollowupView, Refusal, build_view
from tether.harness import EXTENSION_PATH, continuation_checkpoint
from tether.harness.checkpoint import anchors_bound
from tether.harness.run import RunOutcome, RunRequest, execute_run
from tether.ledger import open_ledger
from tether.ledger.jsonl import dump_session, load_lines
from tether.ledger.sql import SqlLedger
from tether.pi.install import find_pi
from tether.recall import read_range

__all__ = ["ACTOR", "EvalOptions", "Progress", "SeedResult", "evaluate", "scorer"]

ACTOR = "user:eval"
PROBE_RECALL = "[eval probe recall]"
PROBE_PLAIN = "[eval probe]"


@dataclass(frozen=True)
class EvalOptions:
    agent: str
    seeds: int = 5
    runs: int = 1
    anchors: bool = True
    probes: bool = True
    budget: int | None = None
    """The follow-up budget (default: the configured ``[followup] budget_bytes``)."""
    scripted: bool = False
    """Use the scripted model (:mod:`tether.eval.scripted`) instead of the agent's provider."""
    directory: Path | None = None
    """Where the workspaces, the ledger and the run directories go (default: a new one under
    ``.tether/eval``)."""


Progress = Callable[[str], None]


@dataclass
class SeedResult:
    seed: int
    facts: list[Fact]
    views: list[ViewScore] = field(default_factory=list)
    """After run 1, 2, … K: the first run's facts against that run's next view."""
    checkpoints: list[str] = field(default_factory=list)
    probes: dict[str, list[bool]] = field(default_factory=dict)
    """``with_recall`` / ``without_recall`` → answered, per fact."""
    recall_calls: dict[str, int] = field(default_factory=dict)
    refused: str | None = None
    seen: list[bool] = field(default_factory=list)
    """Per fact: whether its needle occurs in a row of the first run (a request, a tool call,
    a tool result): a fact the run never saw cannot be lost by its checkpoint."""
    problems: list[str] = field(default_factory=list)
    """Findings that did not stop the seed: a checkpoint not written, a probe refused."""


def revision() -> str:
    """tether's version, and the git commit of its source when it runs from a checkout."""
    here = Path(__file__).resolve().parents[1]
    try:
        version = importlib.metadata.version("tether")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return f"{version}+{done.stdout.strip()}"
    return version


def eval_config(config: Config, options: EvalOptions, root: Path, url: str | None) -> Config:
    """The configuration of the evaluation's runs: the agent's provider, model, effort and
    deadline as configured (or the scripted model), the read and bash tools, the evaluation's
    own ledger, run directories and session workspaces (each session's made from the seed's
    generated workspace, its runs' workdir)."""
    agent = config.agent(options.agent)
    budget = options.budget or config.followup.budget_bytes
    providers = dict(config.providers)
    if url is not None:
        providers = {"eval-scripted": ProviderConfig(base_url=url, context_window=1_000_000)}
        agent = msgspec.structs.replace(agent, provider="eval-scripted", model=MODEL)
    else:
        config.provider(agent.provider)
    agent = msgspec.structs.replace(
        agent,
        tools=["read", "bash"],
        workdir=None,
        checkpoint_min_time_s=0,
        anchors_max_bytes=agent.anchors_max_bytes if options.anchors else 0,
    )
    return Config(
        ledger=LedgerConfig(url=f"sqlite:{root / 'ledger.db'}"),
        followup=msgspec.structs.replace(config.followup, budget_bytes=budget),
        providers=providers,
        agents={options.agent: agent},
        access=AccessConfig(grants={}),
        harness=msgspec.structs.replace(
            config.harness, runs_dir=root / "runs", workspaces_dir=root / "workspaces"
        ),
        # pi need not outlive an evaluation: a stopped evaluation leaves no pi behind.
        custody=msgspec.structs.replace(config.custody, detached=False),
        path=None,
    )


def _view(ledger: Any, config: Config, session: str, agent: str) -> FollowupView | Refusal:
    return build_view(
        ledger,
        session=session,
        agent=agent,
        actor=ACTOR,
        config=config.followup,
        grants=config.access.grants,
    )


def scorer(
    ledger: Any, session: str, actor: str, grants: Mapping[str, Sequence[str]]
) -> Callable[[int, int], str]:
    """The recall tool's answer to one range, as ``actor`` would get it (admission applied)."""

    def recall(first: int, last: int) -> str:
        return read_range(ledger, session, first, last, actor=actor, grants=grants).to_text()

    return recall


async def _run(
    ledger: Any,
    config: Config,
    agent: str,
    session: str,
    text: str,
    workdir: Path,
    *,
    checkpoints: bool = True,
) -> RunOutcome:
    """One real run. A probe (``checkpoints=False``) writes no checkpoint of its own: it asks,
    it does not continue the work."""
    return await execute_run(
        ledger,
        config,
        RunRequest(
            session=session,
            agent=agent,
            text=text,
            actor=ACTOR,
            workdir=workdir,
            extensions=(EXTENSION_PATH,),
        ),
        checkpoint=continuation_checkpoint if checkpoints else None,
    )


def seen_by_run(ledger: Any, session: str, run: str, facts: Sequence[Fact]) -> list[bool]:
    """Per fact, whether its needle occurs in a message row of ``run`` (verbatim, or quoted
    inside JSON as a tool call's arguments)."""
    texts = [
        text_of(row.body)
        for row in ledger.iter_rows(session)
        if row.run == run and isinstance(row.body, dict) and "role" in row.body
    ]
    joined = "\n".join(texts)
    return [
        f.needle in joined or json.dumps(f.needle, ensure_ascii=False)[1:-1] in joined
        for f in facts
    ]


def copy_session(ledger: SqlLedger, session: str, copy: str) -> None:
    """An exact copy of ``session`` as ``copy`` (rows keep their seqs; run ids get a suffix),
    through the JSONL interchange, so a probe leaves the measured session as it was."""
    out = io.StringIO()
    dump_session(ledger, session, out)
    lines = []
    for line in out.getvalue().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "session":
            rec["id"] = copy
        else:
            rec["session"] = copy
        if rec.get("type") == "run":
            rec["id"] = f"{rec['id']}-{copy}"
        elif rec.get("run"):
            rec["run"] = f"{rec['run']}-{copy}"
        lines.append(json.dumps(rec, ensure_ascii=False))
    load_lines(ledger, ("\n".join(lines) + "\n").encode())


def probe_text(facts: list[Fact], recall: bool) -> str:
    head = PROBE_RECALL if recall else PROBE_PLAIN
    how = (
        "You may call recall to read rows your context names."
        if recall
        else "Do not call any tool: answer from your context alone."
    )
    questions = "\n".join(f"{i}. {f.question}" for i, f in enumerate(facts, start=1))
    return (
        f"{head} Answer each question from what this session found, one line each, numbered, "
        f"with the exact value only (or 'unknown'). {how}\n{questions}"
    )


_LINE = re.compile(r"^\s*(\d+)[.):]\s*(.*)$")


def answered(answer: str | None, facts: list[Fact]) -> list[bool]:
    """Exact match per numbered line (:meth:`Fact.answered_by`)."""
    lines: dict[int, str] = {}
    for line in (answer or "").splitlines():
        if (m := _LINE.match(line)) is not None:
            lines.setdefault(int(m.group(1)), m.group(2))
    return [f.answered_by(lines.get(i, "")) for i, f in enumerate(facts, start=1)]


NOTHING_TO_COMPACT = "Nothing to compact"


def pi_estimate(body: dict[str, Any]) -> int:
    """pi's token estimate of one message (``estimateTokens`` in its compaction module):
    characters of text, thinking and tool calls (name and JSON arguments) over 4, rounded up.
    The JSON around them (usage, model, timestamps) counts for nothing."""
    chars = 0
    content = body.get("content")
    if isinstance(content, str):
        chars += len(content)
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            chars += len(str(block.get("text", "")))
        elif block.get("type") == "thinking":
            chars += len(str(block.get("thinking", "")))
        elif block.get("type") == "toolCall":
            args = json.dumps(block.get("arguments"), separators=(",", ":"))
            chars += len(str(block.get("name", ""))) + len(args)
    for key in ("command", "output"):
        if isinstance(body.get(key), str):
            chars += len(body[key])
    return -(-chars // 4)


def nothing_to_compact(ledger: Any, config: Config, agent: str, session: str, run: str) -> str:
    """Why pi answered the compact command "Nothing to compact": the content of the run's
    working view after its first message, as pi estimates it, is under the per-run
    ``compaction.keepRecentTokens``, whatever its bytes (tether's trigger counts the messages'
    whole JSON, pi only their content)."""
    from tether.pi.agentdir import pi_settings

    spec = config.agent(agent)
    keep = pi_settings(config, config.provider(spec.provider), spec)["compaction"]
    rows = [r for r in ledger.iter_rows(session) if r.run == run and "role" in r.body]
    tokens = sum(pi_estimate(r.body) for r in rows[1:])
    return (
        f"pi estimates the run's messages after its request at {tokens} tokens (content "
        f"characters / 4), under compaction.keepRecentTokens = {keep['keepRecentTokens']}, "
        f"so it finds nothing before the newest {keep['keepRecentTokens']} tokens to summarize "
        f"while the working view ({sum(r.bytes for r in rows)} bytes of JSON) is over the "
        f"budget of {config.followup.budget_bytes}"
    )


def _recall_calls(ledger: Any, session: str, run: str) -> int:
    count = 0
    for row in ledger.iter_rows(session):
        content = row.body.get("content") if row.run == run else None
        if isinstance(content, list):
            count += sum(
                1
                for b in content
                if isinstance(b, dict) and b.get("type") == "toolCall" and b.get("name") == "recall"
            )
    return count


async def evaluate_seed(
    ledger: Any,
    config: Config,
    options: EvalOptions,
    ws: Workspace,
    progress: Progress,
) -> SeedResult:
    session = f"eval-{ws.seed}"
    result = SeedResult(ws.seed, ws.facts)
    for k, request in enumerate(ws.requests, start=1):
        progress(f"seed {ws.seed}: run {k} of {len(ws.requests)}")
        try:
            outcome = await _run(ledger, config, options.agent, session, request, ws.root)
        except Refused as exc:  # a finding (e.g. a request over a quarter of the budget)
            result.refused = f"run {k} was refused ({exc.reason.value}): {exc.detail}"
            break
        result.checkpoints.append(outcome.checkpoint.label)
        if k == 1:
            result.seen = seen_by_run(ledger, session, outcome.run, ws.facts)
        if outcome.status.value != "finished":
            result.refused = f"run {outcome.run} ended {outcome.status.value}: {outcome.error}"
            break
        if outcome.checkpoint.label != "written":
            not_tried = outcome.checkpoint.not_tried
            reason = not_tried.value if not_tried is not None else None
            record = ledger.run(outcome.run)
            detail = record.extra.get("checkpoint_detail") if record is not None else None
            if isinstance(detail, str):  # e.g. pi's own answer to compact
                reason = f"{reason}; {detail}" if reason else detail
                if NOTHING_TO_COMPACT in detail:
                    why = nothing_to_compact(ledger, config, options.agent, session, outcome.run)
                    reason = f"{reason}: {why}"
            result.problems.append(
                f"run {k} wrote no checkpoint ({outcome.checkpoint.label}"
                + (f": {reason}" if reason else "")
                + "): the next view quotes the previous one, or none"
            )
        view = _view(ledger, config, session, options.agent)
        if isinstance(view, Refusal):
            # A refused view is a finding (e.g. a summary too large for the budget): recorded,
            # and this seed goes no further.
            result.refused = (
                f"the view after run {k} was refused ({view.reason.value}): {view.detail}"
            )
            break
        result.views.append(
            score_view(view, ws.facts, scorer(ledger, session, ACTOR, config.access.grants))
        )
        if k == 1 and options.probes:
            for label, with_recall in (("without_recall", False), ("with_recall", True)):
                copy = f"{session}-{label.replace('_', '-')}"
                progress(f"seed {ws.seed}: probe {label.replace('_', ' ')}")
                copy_session(ledger, session, copy)
                try:
                    probe = await _run(
                        ledger,
                        config,
                        options.agent,
                        copy,
                        probe_text(ws.facts, with_recall),
                        ws.root,
                        checkpoints=False,
                    )
                except Refused as exc:
                    # A scored refusal: the next run could not have been asked; none answered.
                    result.probes[label] = [False] * len(ws.facts)
                    result.recall_calls[label] = 0
                    result.problems.append(
                        f"the probe {label.replace('_', ' ')} was refused ({exc.reason.value}): "
                        f"{exc.detail}; scored as answering nothing"
                    )
                    continue
                result.probes[label] = answered(probe.answer, ws.facts)
                result.recall_calls[label] = _recall_calls(ledger, copy, probe.run)
    return result


@contextlib.contextmanager
def _model(scripted: bool) -> Iterator[ScriptedModel | None]:
    if not scripted:
        yield None
        return
    with ScriptedModel([]) as model:
        yield model


def evaluate(
    config: Config, options: EvalOptions, progress: Progress = lambda _: None
) -> dict[str, Any]:
    """Run the evaluation and return its record (the ``--json`` shape, docs/cli.md)."""
    if options.seeds < 1 or options.runs < 1:
        raise ConfigError("--seeds and --runs must be at least 1")
    root = (options.directory or Path(".tether") / "eval").resolve()
    private_dir(root)
    for leftover in root.glob("ledger.db*"):
        leftover.unlink()
    # The sessions' workspaces of an earlier evaluation: its sessions' ids come again.
    shutil.rmtree(root / "workspaces", ignore_errors=True)
    pi = find_pi()
    results: list[SeedResult] = []
    with _model(options.scripted) as model:
        cfg = eval_config(config, options, root, model.url if model else None)
        ledger = open_ledger(cfg.ledger.url)
        try:
            for seed in range(1, options.seeds + 1):
                ws = make_workspace(
                    root / f"work-{seed}",
                    seed,
                    runs=options.runs,
                    budget=cfg.followup.budget_bytes,
                )
                if model is not None:
                    model.set_case(ws.plans, ws.facts)
                results.append(anyio.run(evaluate_seed, ledger, cfg, options, ws, progress))
        finally:
            ledger.close()
    agent = cfg.agent(options.agent)
    provider = "scripted" if options.scripted else config.agent(options.agent).provider
    return report(results, cfg, options, agent, provider, pi.version)


def _figures(scores: list[list[bool]]) -> float | None:
    flat = [x for s in scores for x in s]
    return share(flat)


def report(
    results: list[SeedResult],
    cfg: Config,
    options: EvalOptions,
    agent: AgentConfig,
    provider: str,
    pi_version: str,
) -> dict[str, Any]:
    """The record: per kind of fact, the share available (and by part), recoverable, answered;
    decay after each checkpoint; bytes by part; and what produced it."""
    kinds = sorted({f.kind for r in results for f in r.facts}, key=lambda k: k.value)
    first = [r.views[0] for r in results if r.views]

    def available(views: list[ViewScore], pick: Callable[[Fact], bool]) -> float | None:
        return share([s.available for v in views for s in v.facts if pick(s.fact)])

    def by_part(views: list[ViewScore], pick: Callable[[Fact], bool]) -> dict[str, float | None]:
        return {
            p.value: share([p in s.parts for v in views for s in v.facts if pick(s.fact)])
            for p in Part
            if p is not Part.NOTICES
        }

    seen = {(r.seed, f.id): ok for r in results for f, ok in zip(r.facts, r.seen, strict=False)}
    first_by_seed = [(r.seed, r.views[0]) for r in results if r.views]

    def kind_row(pick: Callable[[Fact], bool]) -> dict[str, Any]:
        every = [(seed, s) for seed, v in first_by_seed for s in v.facts if pick(s.fact)]
        # Scored first as seen by the run or not: only what the run saw can reach the next one.
        scored = [s for seed, s in every if seen.get((seed, s.fact.id), True)]
        row: dict[str, Any] = {
            "facts": len(every),
            "seen": share([seen.get((seed, s.fact.id), True) for seed, s in every]),
            "available": share([s.available for s in scored]),
            "available_without_request": share(
                [any(p is not Part.REQUEST for p in s.parts) for s in scored]
            ),
            "by_part": by_part(first, pick),
            "recoverable": share([s.recoverable for s in scored if not s.available]),
            "available_or_recoverable": share([s.available or s.recoverable for s in scored]),
        }
        for label in ("without_recall", "with_recall"):
            marks = [
                ok
                for r in results
                for f, ok in zip(r.facts, r.probes.get(label, []), strict=False)
                if pick(f) and seen.get((r.seed, f.id), True)
            ]
            row[f"answered_{label}"] = share(marks) if marks else None
        return row

    def is_identifier(f: Fact) -> bool:
        return f.kind in IDENTIFIER_KINDS

    def of_kind(kind: FactKind) -> Callable[[Fact], bool]:
        return lambda f: f.kind is kind

    per_kind = {k.value: kind_row(of_kind(k)) for k in kinds}
    decay = []
    for i in range(max((len(r.views) for r in results), default=0)):
        views = [r.views[i] for r in results if len(r.views) > i]
        decay.append(
            {
                "checkpoint": i + 1,
                "identifiers_available": available(views, is_identifier),
                "all_available": available(views, lambda _: True),
                "identifiers_available_or_recoverable": share(
                    [
                        s.available or s.recoverable
                        for v in views
                        for s in v.facts
                        if is_identifier(s.fact)
                    ]
                ),
            }
        )
    parts = sorted({p for v in first for p in v.bytes_by_part})
    return {
        "eval": "continuation",
        "prompt_version": PROMPT_VERSION,
        "revision": revision(),
        "pi_version": pi_version,
        "provider": provider,
        "model": agent.model,
        "agent": options.agent,
        "anchors": options.anchors,
        # The bound the checkpoints were written with (the marker's), not merely the setting.
        "anchors_max_bytes": anchors_bound(agent, cfg.followup.budget_bytes),
        "budget": cfg.followup.budget_bytes,
        "seeds": options.seeds,
        "runs": options.runs,
        "checkpoints": [r.checkpoints for r in results],
        "problems": [
            f"seed {r.seed}: {problem}"
            for r in results
            for problem in [*r.problems, *([r.refused] if r.refused else [])]
        ],
        "identifiers": kind_row(is_identifier),
        "all": kind_row(lambda _: True),
        "kinds": per_kind,
        "decay": decay,
        "bytes_by_part": {
            p: round(sum(v.bytes_by_part.get(p, 0) for v in first) / max(1, len(first)))
            for p in parts
        },
        "view_bytes": round(sum(v.view_bytes for v in first) / max(1, len(first))),
        "summary_identifiers": sorted(
            {
                s.fact.needle
                for r in results
                for v in r.views
                for s in v.facts
                if Part.SUMMARY in s.parts and is_identifier(s.fact)
            }
        ),
        "recall_calls": {
            label: sum(r.recall_calls.get(label, 0) for r in results)
            for label in ("without_recall", "with_recall")
        },
        "seed_results": [
            {
                "seed": r.seed,
                "facts": [
                    {**f.to_json(), "seen": ok}
                    for f, ok in zip(r.facts, r.seen or [True] * len(r.facts), strict=False)
                ],
                "after_checkpoint": [[s.to_json() for s in v.facts] for v in r.views],
                "answered": r.probes,
            }
            for r in results
        ],
    }
