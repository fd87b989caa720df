"""The docs in docs/ cover every CLI command (with its options) and every configuration key; the
README links only inside the repository."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import typer

from tether.cli.app import app
from tether.config import Config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_KEYS = {"path"}
"""Config fields no one writes: ``path`` is where the loader read the file from."""


def commands() -> Iterator[tuple[str, Any]]:
    """Every leaf command of the typer app, as ``tether a b``, with its click command."""

    def walk(cmd: Any, name: str) -> Iterator[tuple[str, Any]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            for sub_name, sub in sorted(subs.items()):
                yield from walk(sub, f"{name} {sub_name}")
        else:
            yield name, cmd

    yield from walk(typer.main.get_command(app), "tether")


def _struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def config_keys(model: type[msgspec.Struct] = Config, prefix: str = "") -> Iterator[str]:
    """Every key of the config sections, dotted; tables of named sections as ``<name>``."""
    hints = typing.get_type_hints(model)
    for field in msgspec.structs.fields(model):
        name = field.name
        if not prefix and name in NOT_KEYS:
            continue
        key = f"{prefix}{name}"
        ann = hints[name]
        if typing.get_origin(ann) is typing.Annotated:
            ann = typing.get_args(ann)[0]
        if _struct(ann):
            yield from config_keys(ann, f"{key}.")
            continue
        if typing.get_origin(ann) is dict:
            value = typing.get_args(ann)[1]
            if _struct(value):
                yield from config_keys(value, f"{key}.<name>.")
                continue
        if typing.get_origin(ann) is list and _struct(typing.get_args(ann)[0]):
            yield key  # an array of tables: the array, then each table's keys
            yield from config_keys(typing.get_args(ann)[0], f"{key}[].")
            continue
        if isinstance(ann, types.UnionType):
            inner = [a for a in typing.get_args(ann) if _struct(a)]
            assert len(inner) <= 1, f"{key}: walk unions of sections too"
            if inner:  # an optional section ([bridges.matrix]): its keys
                yield from config_keys(inner[0], f"{key}.")
                continue
        yield key


def sections(text: str) -> dict[str, str]:
    """A markdown file's ``## `title` `` sections (title → body)."""
    out: dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip().strip("`")] = body
    return out


CLI = sections((DOCS / "cli.md").read_text())
CONFIG = (DOCS / "configuration.md").read_text()


def test_the_walks_find_what_there_is() -> None:
    names = [name for name, _ in commands()]
    assert {"tether run", "tether import pi", "tether ledger load"} <= set(names)
    keys = set(config_keys())
    assert {"ledger.url", "providers.<name>.base_url", "access.grants"} <= keys


def undocumented_options(name: str, cli: dict[str, str]) -> list[str]:
    """What docs/cli.md lacks of one command: its section, or options missing from it."""
    if name not in cli:
        return [f"section '## `{name}`'"]
    cmd = dict(commands())[name]
    # the first cells of the section's table rows: `--session`, `-s` | `FILE` | `--config`, …
    firsts = [
        line.strip().strip("|").split("|")[0]
        for line in cli[name].splitlines()
        if line.startswith("| `")
    ]
    missing = []
    for param in cmd.params:
        if param.param_type_name == "argument":
            shown = param.name.upper()
        else:
            shown = next(o for o in param.opts if o.startswith("--"))
        if not any(f"`{shown}`" in cell for cell in firsts):
            missing.append(shown)
    return missing


def undocumented_key(key: str, text: str) -> str | None:
    """Why docs/configuration.md does not document ``key`` (None when it does): each key needs
    a table row ``| `key` | default | meaning |``."""
    row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
    if row is None:
        return "no table row"
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if len(cells) < 3 or not cells[1] or not cells[2]:
        return "the row needs a default and a meaning"
    return None


@pytest.mark.parametrize("name", [name for name, _ in commands()])
def test_every_command_and_option_is_documented(name: str) -> None:
    assert undocumented_options(name, CLI) == [], f"docs/cli.md, {name}"


@pytest.mark.parametrize("key", list(config_keys()))
def test_every_config_key_is_documented_with_its_default(key: str) -> None:
    assert undocumented_key(key, CONFIG) is None, f"docs/configuration.md, `{key}`"


def test_the_checks_fail_when_something_is_missing() -> None:
    key = "harness.stop_grace_s"
    without = "\n".join(line for line in CONFIG.splitlines() if f"`{key}`" not in line)
    assert undocumented_key(key, without) == "no table row"
    cli = dict(CLI)
    body = cli["tether import pi"]
    cli["tether import pi"] = body.replace("`--actor`", "`--someone`")
    assert undocumented_options("tether import pi", cli) == ["--actor"]
    del cli["tether export pi"]
    assert undocumented_options("tether export pi", cli) == ["section '## `tether export pi`'"]


def test_readme_links_stay_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", readme)
    assert "../" not in readme
    for target in targets:
        if target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        assert not re.match(r"[a-z]+:", path), f"README links outside: {target}"
        assert (ROOT / path).exists(), f"README links to a missing file: {target}"
    for doc in ("configuration.md", "contracts.md", "operations.md", "cli.md"):
        assert f"docs/{doc}" in targets


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_docs_link_only_inside_the_repository(doc: str) -> None:
    text = (DOCS / doc).read_text()
    assert "../shared" not in text
    for target in re.findall(r"\]\(([^)]+)\)", text):
        path = target.split("#", 1)[0]
        if not path:
            continue
        assert not re.match(r"[a-z]+:", path), f"docs/{doc} links outside: {target}"
        assert (DOCS / path).resolve().is_relative_to(ROOT), f"docs/{doc}: {target}"
        assert (DOCS / path).exists(), f"docs/{doc} links to a missing file: {target}"


def documented_error_exits(text: str) -> list[tuple[str, str, int]]:
    """docs/cli.md's table of errors: (class name, label, status), in its order."""
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| (\d) \|$", text, flags=re.MULTILINE)
    return [(name, label.strip(), int(status)) for name, label, status in rows]


def test_the_error_table_is_the_mapping_every_command_uses() -> None:
    from tether.cli.exits import ERROR_EXITS

    text = (DOCS / "cli.md").read_text()
    mapping = [(e.error.__name__, e.label, int(e.status)) for e in ERROR_EXITS]
    assert documented_error_exits(text) == mapping
    # and the check sees a wrong status
    wrong = text.replace(
        "| `StorageError` | ledger error | 1 |", "| `StorageError` | ledger error | 4 |"
    )
    assert documented_error_exits(wrong) != mapping
