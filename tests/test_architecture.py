"""The one-way flow, checked: no module imports a package above its own floor, no import circle
between modules, and no module over 600 lines without a reason (docs/architecture.md states the
rules, the floors and the reasons)."""

from __future__ import annotations

import ast
import re
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
    "images": 1,
    "processes": 1,
    "threads": 1,
    "telemetry": 1,
    "usage": 1,
    # 2: storage and admission
    "ledger": 2,
    "access": 2,
    "admission": 2,
    "sandbox": 2,
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
    # 7: chat threads as sessions: queue requests and run workers as the service does
    "bridges": 7,
    # 8: the ways in
    "cli": 8,
    "demo": 8,
}
"""A module may import its own package and packages on lower floors, never one on its own floor
or above. The top-level ``tether`` package (the public surface) and ``__main__`` re-export."""

EXEMPT = {"__init__", "__main__"}


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _absolute_imports(path: Path) -> list[str]:
    """Every absolute module name ``path`` imports, wherever the import stands."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for name in _absolute_imports(path):
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


# -- no import circle --------------------------------------------------------------------------

DOC = ROOT.parent.parent / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The tether modules that importing ``path`` may run: at module level or inside a
    function (a lazy import still runs when called), and the packages (``__init__``) above
    each one, except the importer's own (running already when it imports)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    named: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
    found: set[str] = set()
    for name in named:
        parts = name.split(".")
        for i in range(2, len(parts) + 1):
            target = ".".join(parts[:i])
            if target in modules and not (me == target or me.startswith(target + ".")):
                found.add(target)
    return found - {me}


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(paths)
    return {name: _module_imports(path, modules) for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _exempt_from_circles() -> set[tuple[str, str]]:
    """Import edges docs/architecture.md excuses, one a line:
    ``- circle exempt: `a` → `b`: why``."""
    doc = DOC.read_text(encoding="utf-8")
    return {
        (a, b)
        for a, b, why in re.findall(
            r"^- circle exempt: `([\w.]+)` → `([\w.]+)`: (\S.*)$", doc, re.M
        )
    }


def test_no_import_circle_between_modules() -> None:
    graph = _import_graph()
    for a, b in _exempt_from_circles():
        graph.get(a, set()).discard(b)
    circles = _circles(graph)
    assert not circles, (
        "import circles (docs/architecture.md, 'Floors and circles'):\n"
        + "\n".join(" ↔ ".join(c) for c in circles)
    )


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_lazy_imports_and_packages() -> None:
    graph = _import_graph()
    # a lazy import inside a function is an edge (tether.harness.tools reads recall lazily)
    assert "tether.recall" in graph["tether.harness.tools"]
    # importing a submodule runs its package: driver → tether.harness.custody (its __init__)
    assert "tether.harness.custody" in graph["tether.harness.driver"]
    # but not the importer's own package (it runs already)
    assert "tether.harness" not in graph["tether.harness.driver"]


# -- no module over 600 lines without a reason -------------------------------------------------

MAX_LINES = 600


def _long_modules_excused() -> dict[str, str]:
    """``- `tether/x/y.py` (N lines): why`` lines of docs/architecture.md's list."""
    doc = DOC.read_text(encoding="utf-8")
    section = doc.split("### Modules over 600 lines", 1)
    assert len(section) == 2, "docs/architecture.md has no '### Modules over 600 lines' section"
    body = section[1].split("\n#", 1)[0]
    return {
        path: why.strip()
        for path, why in re.findall(r"^- `(tether/[\w/]+\.py)`[^:\n]*: (\S.*)$", body, re.M)
    }


def test_no_module_over_600_lines_without_a_reason() -> None:
    excused = _long_modules_excused()
    long = {
        str(p.relative_to(ROOT.parent)): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(ROOT.rglob("*.py"))
    }
    over = {path: n for path, n in long.items() if n > MAX_LINES and path not in excused}
    assert not over, (
        f"modules over {MAX_LINES} lines: split them, or say why in docs/architecture.md "
        f"('### Modules over 600 lines'): {over}"
    )
    stale = sorted(path for path in excused if long.get(path, 0) <= MAX_LINES)
    assert not stale, f"docs/architecture.md excuses modules that are not over {MAX_LINES}: {stale}"


def test_only_the_keeper_signals_a_process_group() -> None:
    """pi's process group is signalled in one function, ``tether.pi.keeper.signal_group``."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "killpg":
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert len(found) == 1, found
    assert found[0].startswith("tether/pi/keeper.py:"), found


PRESENTATION = {"rich", "typer", "click", "jinja2"}
"""Libraries that show things to people: the CLI's and the service's, never the core's."""


def test_the_functional_core_imports_no_presentation() -> None:
    wrong = []
    for path in sorted((ROOT / "followup").rglob("*.py")):
        wrong += [
            f"{path.relative_to(ROOT)} imports {n}"
            for n in _absolute_imports(path)
            if n.split(".")[0] in PRESENTATION
        ]
    assert not wrong, "render in the CLI or the service, not in followup/:\n" + "\n".join(wrong)
