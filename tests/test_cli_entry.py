"""The ``tether`` program (``tether.cli.entry``): ``tether run``'s head start, made from the raw
arguments before the CLI loads and taken by the command only for the same arguments; and the
exit without the interpreter's teardown, which must lose nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from provider import Reply, ScriptedProvider, ToolCall
from test_launch import alive, make_config, placement, wait_for
from tether.cli import run_start
from tether.cli.app import app, load_command
from tether.cli.run_start import RunArgs, parse
from tether.config import Config
from tether.ledger import RunStatus, open_ledger
from tether.pi import keeper
from tether.pi.launch import runs_dir

RUN = load_command("run")


class _Taken(Exception):
    def __init__(self, args: RunArgs) -> None:
        self.args_seen = args


def command_args(argv: list[str]) -> RunArgs | None:
    """The arguments the `run` command itself would look for a head start with (typer's own
    parsing of ``argv``), or None when it rejects them."""

    def seen(args: RunArgs) -> None:
        raise _Taken(args)

    original = run_start.take
    run_start.take = seen  # type: ignore[assignment]
    try:
        result = CliRunner().invoke(app, ["run", *argv])
    finally:
        run_start.take = original  # type: ignore[assignment]
    return result.exception.args_seen if isinstance(result.exception, _Taken) else None


def test_the_parser_knows_every_option_of_the_command() -> None:
    spelled = {f"--{name.rstrip('=')}" for name in run_start.LONG_OPTIONS}
    takes_value = {f"--{name[:-1]}" for name in run_start.LONG_OPTIONS if name.endswith("=")}
    shorts = {f"-{c}" for c in run_start.SHORT_OPTIONS.replace(":", "")}
    options = [p for p in RUN.params if p.param_type_name == "option" and p.name != "help"]
    assert len(options) == 8
    for param in options:
        for name in (*param.opts, *param.secondary_opts):
            assert name in spelled | shorts, f"run_start does not know {name}"
            if name.startswith("--"):
                assert (name in takes_value) == (not getattr(param, "is_flag", False)), name


VALUES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8
).filter(lambda v: not v.startswith("-"))


@st.composite
def run_argv(draw: st.DrawFn) -> list[str]:
    """``tether run`` arguments in any order and spelling, sometimes with a mistake."""
    parts: list[list[str]] = []
    for long, short in (
        ("--session", "-s"),
        ("--agent", "-a"),
        ("--actor", None),
        ("--workdir", None),
        ("--config", "-c"),
        ("--ledger", None),
    ):
        if long in ("--session", "--agent") and draw(st.integers(0, 9)) == 0:
            continue  # a required option left out
        if long not in ("--session", "--agent") and draw(st.booleans()):
            continue
        value = draw(VALUES)
        style = draw(st.sampled_from(["long", "equals", "short", "joined"]))
        if style == "equals" or (style in ("short", "joined") and short is None):
            parts.append([f"{long}={value}"])
        elif style == "short" and short is not None:
            parts.append([short, value])
        elif style == "joined" and short is not None:
            parts.append([short + value])
        else:
            parts.append([long, value])
    for flag in ("--json", "--no-wait"):
        if draw(st.booleans()):
            parts.append([flag])
    requests = draw(st.lists(VALUES, min_size=0, max_size=2))
    parts += [[r] for r in requests]
    order = draw(st.permutations(range(len(parts))))
    argv = [word for i in order for word in parts[i]]
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--help", "--sess"])))
    return argv


@settings(max_examples=300, deadline=None)
@given(run_argv())
def test_a_head_start_is_made_only_for_what_the_command_reads_the_same_way(
    argv: list[str],
) -> None:
    guessed = parse(argv)
    if guessed is not None:
        # Whatever the head start guessed, the command reads the same arguments (or rejects
        # them, and the start is abandoned at exit).
        assert command_args(argv) in (guessed, None)
    if "--help" not in argv and "--sess" not in argv:
        assert guessed == command_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["-s", "s1", "-a", "rev", "hello"],
        ["hello", "--json", "--session=s1", "-arev", "--workdir", "w", "-c", "t.toml"],
        ["--actor", "user:ana", "-s", "s1", "--no-wait", "-a", "rev", "--ledger", "memory:", "hi"],
    ],
)
def test_plain_arguments_get_a_head_start_for_what_the_command_reads(argv: list[str]) -> None:
    guessed = parse(argv)
    assert guessed is not None
    assert guessed == command_args(argv)


@pytest.fixture
def config(tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]) -> Config:
    provider = scripted_provider([Reply("done")])
    return make_config(tmp_path, provider.url)


def _run_dirs(config: Config) -> list[Path]:
    where = runs_dir(config)
    return sorted(where.iterdir()) if where.exists() else []


def test_a_head_start_for_other_arguments_is_abandoned(config: Config) -> None:
    argv = ["--config", str(config.path), "-s", "s1", "-a", "rev", "--json", "hello"]
    run_start.head_start(argv)
    try:
        head = run_start._head
        assert head is not None
        assert head.launch is not None
        assert head.text == "hello"
        wait_for(lambda: (head.launch.run_dir / keeper.PLACEMENT_NAME).exists(), 10, "keeper")
        pi_pid = placement(head.launch.run_dir)["pi_pid"]
        other = RunArgs("hello", "s2", "rev", config=config.path)
        assert run_start.take(other) is None
        assert not alive(pi_pid), "pi of the abandoned start still runs"
        assert _run_dirs(config) == []
        assert run_start._head is None
    finally:
        run_start._abandon_head()


def test_a_head_start_is_taken_once_for_the_same_arguments(config: Config) -> None:
    argv = ["hello", "--session=s1", "--agent", "rev", f"--config={config.path}"]
    run_start.head_start(argv)
    try:
        taken = run_start.take(RunArgs("hello", "s1", "rev", config=config.path))
        assert taken is not None
        assert taken.launch is not None
        assert run_start.take(RunArgs("hello", "s1", "rev", config=config.path)) is None
        taken.abandon()
        assert _run_dirs(config) == []
    finally:
        run_start._abandon_head()


@pytest.mark.parametrize(
    "argv",
    [
        ["--session", "s1", "--agent", "rev", ""],  # an empty request
        ["--session", "s\n1", "--agent", "rev", "hi"],  # an id on two lines
        ["--session", "s1", "--agent", "nobody", "hi"],  # no such agent
        ["--session", "s1", "--agent", "rev", "-"],  # stdin: the command reads it
        ["--session", "s1", "--agent", "rev", "--help"],
    ],
)
def test_no_head_start_where_the_command_would_refuse_or_read_stdin(
    config: Config, argv: list[str]
) -> None:
    run_start.head_start(["--config", str(config.path), *argv])
    assert run_start._head is None
    assert not runs_dir(config).exists()
    assert config.path is not None
    assert not (config.path.parent / "ledger.db").exists()


def test_a_head_start_the_command_never_takes_ends_with_the_process(config: Config) -> None:
    # A head start made, then the process exits without the command (here: it raises).
    code = textwrap.dedent(
        f"""
        from tether.cli import run_start
        run_start.head_start(["--config", {str(config.path)!r}, "-s", "s1", "-a", "rev", "hi"])
        print(run_start._head.launch.run_dir, flush=True)
        raise SystemExit(3)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    run_dir = Path(done.stdout.strip())
    assert run_dir.parent == runs_dir(config)
    assert not run_dir.exists()
    assert _run_dirs(config) == []
    strays = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.cmdline())]
    assert strays == []


def test_tether_run_takes_its_head_start(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    provider = scripted_provider([Reply("the answer")])
    cfg = make_config(tmp_path, provider.url)
    argv = ["run", "-c", str(cfg.path), "-s", "s1", "-a", "rev", "--json", "what is it?"]
    done = subprocess.run(
        [sys.executable, "-m", "tether", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "error::ResourceWarning"},
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["answer"]) == ("finished", "the answer")
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        runs = store.runs("s1")
    assert [(r.id, r.status) for r in runs] == [(out["run"], RunStatus.FINISHED)]
    assert _run_dirs(cfg) == [], "one run, one directory, removed after a good end"


def test_the_command_runs_on_the_head_start_it_takes(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    provider = scripted_provider([Reply("the answer")])
    cfg = make_config(tmp_path, provider.url)
    argv = ["-c", str(cfg.path), "-s", "s1", "-a", "rev", "--json", "what is it?"]
    # What `tether` does, with the head start's run id shown before the command runs.
    code = textwrap.dedent(
        f"""
        import sys
        from tether.cli import run_start
        from tether.cli.app import main
        run_start.head_start({argv!r})
        print(run_start._head.run_id, file=sys.stderr, flush=True)
        sys.argv = ["tether", "run", *{argv!r}]
        main()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    head_run = done.stderr.splitlines()[0]
    assert json.loads(done.stdout)["run"] == head_run


def _tether_run(tmp_path: Path, cfg: Config, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["run", "-c", str(cfg.path), "-s", "s1", "-a", "rev", "--json", *args]
    return subprocess.run(
        [sys.executable, "-m", "tether", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


def test_without_custody_the_run_starts_its_own_pi(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    # The bash tool's parent is pi; pi's parent is recorded from /proc.
    record = "awk '{print $4}' /proc/$PPID/stat > parent.txt"
    provider = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": record})]), Reply("ok")]
    )
    cfg = make_config(tmp_path, provider.url)
    assert cfg.path is not None
    cfg.path.write_text(cfg.path.read_text() + "\n[custody]\ndetached = false\n")
    argv = ["run", "-c", str(cfg.path), "-s", "s1", "-a", "rev", "--json", "go"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "tether", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    assert json.loads(out)["status"] == "finished"
    # No head start under a keeper: pi was the CLI's own child.
    assert int((tmp_path / "work" / "parent.txt").read_text()) == cli.pid
    assert _run_dirs(cfg) == []


def test_workdir_on_the_command_line_is_where_the_tools_run_and_is_checked(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    provider = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": "touch made-here"})]), Reply("ok")]
    )
    cfg = make_config(tmp_path, provider.url)
    # A workdir that holds the ledger is refused before anything is written.
    refused = _tether_run(tmp_path, cfg, "--workdir", str(tmp_path), "go")
    assert refused.returncode == 2, refused.stderr
    assert "contains the ledger" in refused.stderr
    assert not (tmp_path / "ledger.db").exists()
    assert not runs_dir(cfg).exists()
    assert provider.task_requests == []
    elsewhere = tmp_path / "elsewhere"
    done = _tether_run(tmp_path, cfg, "--workdir", str(elsewhere), "go")
    assert done.returncode == 0, done.stderr
    assert (elsewhere / "made-here").exists()
    assert not (tmp_path / "work" / "made-here").exists()


EXIT_PROBE = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path
    from tether.cli.entry import exit_now
    mode, out = sys.argv[1], Path(sys.argv[2])
    atexit.register(lambda: out.with_suffix(".atexit").write_text("ran"))
    if mode == "big":
        sys.stdout.write("x" * 1_000_000)  # buffered: the exit must flush it
        exit_now(0)
    if mode == "status":
        exit_now(5)
    if mode == "message":
        exit_now("it went wrong")
    if mode == "thread":
        def late():
            time.sleep(0.3)
            out.write_text("finished")
        threading.Thread(target=late).start()  # not a daemon: the ordinary exit waits for it
        exit_now(0)
    """
)


@pytest.mark.parametrize(
    ("mode", "status"), [("big", 0), ("status", 5), ("message", 1), ("thread", 0)]
)
def test_the_quick_exit_loses_nothing(tmp_path: Path, mode: str, status: int) -> None:
    out = tmp_path / "out.txt"
    done = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, mode, str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == status, done.stderr
    assert out.with_suffix(".atexit").read_text() == "ran", "exit handlers must run"
    if mode == "big":
        assert len(done.stdout) == 1_000_000
    if mode == "message":
        assert done.stderr.strip() == "it went wrong"
    if mode == "thread":
        assert out.read_text() == "finished", "a running thread was cut short"
