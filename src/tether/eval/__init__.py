"""Measuring what the next run knows (docs/cli.md#tether-eval-continuation): ``tether eval
continuation``.

    record = evaluate(load_config(), EvalOptions(agent="reviewer", seeds=5, runs=3))
    record["identifiers"]["available"]   # share of planted identifiers in the next view

It drives real pi runs through the harness (so it stands above it) and scores planted facts by
exact match: no judge model.
"""

from __future__ import annotations

from tether.eval.continuation import EvalOptions, evaluate, scorer
from tether.eval.score import FactScore, Part, ViewScore, named_calls, score_view
from tether.eval.scripted import SUMMARY, ScriptedModel
from tether.eval.workspace import IDENTIFIER_KINDS, PROMPT_VERSION, Fact, FactKind, make_workspace

__all__ = [
    "IDENTIFIER_KINDS",
    "PROMPT_VERSION",
    "SUMMARY",
    "EvalOptions",
    "Fact",
    "FactKind",
    "FactScore",
    "Part",
    "ScriptedModel",
    "ViewScore",
    "evaluate",
    "make_workspace",
    "named_calls",
    "score_view",
    "scorer",
]
