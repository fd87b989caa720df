"""The extension's anchor extraction (src/tether/extension/anchors.ts, run compiled under node):
error lines taken from real tools' output and never a command line; what people said; measured
values; the model's own failed guesses ranked after what the tools found."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ANCHORS_JS = Path(__file__).resolve().parents[1] / "src/tether/extension/js/anchors.js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

GCC = """\
[0000] cc -O2 -c src/mod0.c -o build/mod0.o
src/mod0.c: In function 'main':
src/mod0.c:3:5: error: expected ';' before '}' token
make: *** [Makefile:4: build/mod0.o] Error 1
Command exited with code 2"""

PYTEST = """\
============================= test session starts ==============================
collected 3 items

tests/test_a.py .F.                                                      [100%]

=================================== FAILURES ===================================
___________________________________ test_sum ___________________________________

    def test_sum():
>       assert add(1, 2) == 4
E       assert 3 == 4

tests/test_a.py:5: AssertionError
=========================== short test summary info ============================
FAILED tests/test_a.py::test_sum - assert 3 == 4
========================= 1 failed, 2 passed in 0.04s ==========================
Command exited with code 1"""

NPM = """\
> app@1.0.0 build
> tsc -p .

src/index.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.
npm error Lifecycle script `build` failed with error:
npm error code 2
npm ERR! code ELIFECYCLE
Command exited with code 2"""

CARGO = """\
   Compiling demo v0.1.0 (/work/demo)
error[E0308]: mismatched types
 --> src/main.rs:2:18
  |
2 |     let x: i32 = "a";
  |            ---   ^^^ expected `i32`, found `&str`
error: could not compile `demo` (bin "demo") due to 1 previous error
Command exited with code 101"""

TRACEBACK = """\
Traceback (most recent call last):
  File "/work/app/main.py", line 9, in <module>
    main()
  File "/work/app/main.py", line 6, in main
    raise ValueError("shard 7 has no owner")
ValueError: shard 7 has no owner
Command exited with code 1"""

MEASURED = """\
bench: p50 latency 12.5 ms over 1000 requests
throughput=840 req/s
rss: 312
plain words and a 3 here
"""


def _branch(turns: list[tuple[str, dict[str, Any], str, bool]], said: list[str]) -> list[dict]:
    """pi branch entries: the user messages, then per turn a tool call and its result."""
    entries: list[dict[str, Any]] = []
    n = 0

    def entry(message: dict[str, Any]) -> None:
        nonlocal n
        n += 1
        entries.append({"type": "message", "id": f"e{n}", "message": message})

    for text in said:
        entry({"role": "user", "content": [{"type": "text", "text": text}]})
    for i, (tool, args, out, failed) in enumerate(turns):
        call = f"c{i}"
        entry(
            {
                "role": "assistant",
                "content": [{"type": "toolCall", "id": call, "name": tool, "arguments": args}],
            }
        )
        entry(
            {
                "role": "toolResult",
                "toolCallId": call,
                "toolName": tool,
                "isError": failed,
                "content": [{"type": "text", "text": out}],
            }
        )
    return entries


def extract(branch: list[dict[str, Any]], max_bytes: int = 8000) -> dict[str, Any]:
    assert NODE is not None
    script = (
        f"import {{ extractAnchors }} from {json.dumps(ANCHORS_JS.as_uri())};\n"
        "let s = ''; process.stdin.on('data', (d) => (s += d));\n"
        "process.stdin.on('end', () => { const a = JSON.parse(s);\n"
        "  process.stdout.write(JSON.stringify(extractAnchors(a.branch, a.max))); });\n"
    )
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        input=json.dumps({"branch": branch, "max": max_bytes}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _of(anchors: dict[str, Any], kind: str) -> list[str]:
    return [a["text"] for a in anchors["items"] if a["kind"] == kind]


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            GCC,
            [
                "src/mod0.c:3:5: error: expected ';' before '}' token",
                "make: *** [Makefile:4: build/mod0.o] Error 1",
            ],
        ),
        (PYTEST, ["E       assert 3 == 4", "FAILED tests/test_a.py::test_sum - assert 3 == 4"]),
        (
            NPM,
            [
                "src/index.ts(3,7): error TS2322: Type 'string' is not assignable to type"
                " 'number'.",
                "npm error Lifecycle script `build` failed with error:",
                "npm error code 2",
                "npm ERR! code ELIFECYCLE",
            ],
        ),
        (
            CARGO,
            [
                "error[E0308]: mismatched types",
                'error: could not compile `demo` (bin "demo") due to 1 previous error',
            ],
        ),
        (TRACEBACK, ["ValueError: shard 7 has no owner"]),
    ],
    ids=["gcc-make", "pytest", "npm-tsc", "cargo", "python-traceback"],
)
def test_errors_are_the_diagnostic_lines_of_real_outputs(log: str, expected: list[str]) -> None:
    anchors = extract(_branch([("bash", {"command": "make build"}, log, True)], []))
    assert _of(anchors, "error") == expected
    for text in _of(anchors, "error"):
        assert not text.startswith(("[0000] cc", "cc ", "> ", "Traceback", "   Compiling"))


def test_a_failed_result_without_a_diagnostic_gives_its_last_line_not_a_command() -> None:
    only_commands = "[0001] cc -O2 -c src/mod1.c -o build/mod1.o\nCommand exited with code 1"
    shell = "sh: 1: frobnicate: not found\nCommand exited with code 127"
    anchors = extract(
        _branch(
            [
                ("bash", {"command": "make"}, only_commands, True),
                ("bash", {"command": "frobnicate --all"}, shell, True),
            ],
            [],
        )
    )
    assert _of(anchors, "error") == ["sh: 1: frobnicate: not found"]


def test_what_people_said_is_kept_newest_first_and_clipped() -> None:
    long = "Audit the repository. " * 60 + "We decided: keep 7 shards until T-4f2a1 lands."
    anchors = extract(_branch([], ["first: use ticket T-0001", long, "steer: stop after src/"]))
    said = _of(anchors, "said")
    assert said[0] == "steer: stop after src/"
    assert said[2] == "first: use ticket T-0001"
    assert len(said[1]) == 1000
    assert said[1].endswith("…")


def test_measured_values_are_taken_from_tool_output_only() -> None:
    anchors = extract(
        _branch([("bash", {"command": "sh bench.sh"}, MEASURED, False)], ["limit is 5 ms"])
    )
    assert _of(anchors, "measure") == [
        "bench: p50 latency 12.5 ms over 1000 requests",
        "throughput=840 req/s",
        "rss: 312",
    ]


def test_the_models_failed_guesses_come_after_what_the_tools_found() -> None:
    listing = "src/app/main.py\nsrc/app/util.py\n"
    turns = [
        ("bash", {"command": "ls -R src"}, listing, False),
        ("read", {"path": "src/app/main.py"}, "x = 1  # sha " + "ab" * 20, False),
        ("read", {"path": "src/app/guessed.py"}, "ENOENT: no such file or directory", True),
        ("bash", {"command": "frobnicate"}, "sh: 1: frobnicate: not found\n", True),
    ]
    anchors = extract(_branch(turns, []))
    texts = [(a["kind"], a["text"]) for a in anchors["items"]]
    found = texts.index(("read", "src/app/main.py"))
    for guess in [
        ("read", "src/app/guessed.py"),
        ("error", "ENOENT: no such file or directory"),
        ("command", "frobnicate"),
        ("error", "sh: 1: frobnicate: not found"),
    ]:
        assert texts.index(guess) > found, texts
    # A bound with room for the tools' finds only: the guesses are the ones left out.
    fresh = anchors["items"][: found + 2]  # the listing's command, the read and its SHA
    bound = 2 + sum(len(json.dumps(a, separators=(",", ":"))) + 1 for a in fresh)
    small = extract(_branch(turns, []), max_bytes=bound)
    kept = {(a["kind"], a["text"]) for a in small["items"]}
    assert ("read", "src/app/main.py") in kept
    assert ("command", "frobnicate") not in kept
    assert small["omitted"] > 0
