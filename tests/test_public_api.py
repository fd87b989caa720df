"""The public surface: every name in ``tether.__all__`` resolves, and the packages are real
packages (a wheel, unlike an editable install, ships only directories with ``__init__.py``)."""

from __future__ import annotations

from pathlib import Path

import tether


def test_every_exported_name_resolves() -> None:
    for name in tether.__all__:
        assert getattr(tether, name) is not None, name
    assert sorted(tether.__all__) == tether.__all__


def test_every_source_directory_is_a_package() -> None:
    root = Path(tether.__file__).parent
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        if directory.name in {"__pycache__", "examples", "extension"}:
            continue
        if any(directory.glob("*.py")):
            assert (directory / "__init__.py").exists(), f"{directory} has no __init__.py"
