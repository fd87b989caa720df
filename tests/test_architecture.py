"""The one-way flow, checked: no module imports a package above its own floor
(docs/architecture.md states the rule and the floors)."""

from __future__ import annotations

import ast
from pathlib import Path

import tether

ROOT = Path(tether.__file__).parent

FLOORS: dict[str, int] = {
    # 0: the error tree
    "errors": 0,
    # 1: the foundation every room stands on
    "clock": 1,
    "sizes": 1,
    "config": 1,
    "events": 1,
    "files": 1,
    "ids": 1,
    "processes": 1,
    # 2: storage and admission
    "ledger": 2,
    "access": 2,
    "admission": 2,
    # 3: pure logic over bounded reads; speaking to pi; the embedded model
    "followup": 3,
    "pi": 3,
    "model": 3,
    "runtime": 3,
    "recall": 3,
    # 4: pi's entries into the ledger
    "mirror": 4,
    # 5: one run's lifecycle; pi session files in and out
    "harness": 5,
    "interop": 5,
    # 6: looking at all of the above without changing anything
    "doctor": 6,
    # 6: the service: HTTP API, event streams, workers
    "service": 6,
    # 6: measuring what the next run knows: drives runs through the harness
    "eval": 6,
    # 7: the ways in
    "cli": 7,
    "demo": 7,
}
"""A module may import its own package and packages on lower floors, never one on its own floor
or above. The top-level ``tether`` package (the public surface) and ``__main__`` re-export."""

EXEMPT = {"__init__", "__main__"}


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tether" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_has_a_floor() -> None:
    packages = {_package_of(p) for p in ROOT.rglob("*.py")} - EXEMPT
    missing = sorted(packages - FLOORS.keys())
    assert not missing, f"give these a floor in tests/test_architecture.py and docs: {missing}"


def test_no_module_imports_a_package_above_its_own_floor() -> None:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        own = _package_of(path)
        if own in EXEMPT:
            continue
        for target in _imports(path) - {own}:
            if target in EXEMPT:
                continue
            if FLOORS[target] >= FLOORS[own]:
                wrong.append(
                    f"{path.relative_to(ROOT)} ({own}, floor {FLOORS[own]}) imports "
                    f"{target} (floor {FLOORS[target]})"
                )
    assert not wrong, "\n".join(wrong)


def test_the_floors_are_documented() -> None:
    doc = (ROOT.parent.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for package in FLOORS:
        assert f"`{package}`" in doc, f"docs/architecture.md does not name `{package}`"
