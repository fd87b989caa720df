"""The ``tether`` program (``tether.cli.entry``): ``tether run``'s head start, made from the raw
arguments before the CLI loads and run without the CLI only when the command would read them the
same way; and the exit without the interpreter's teardown, which must lose nothing."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from support import (
    Reply,
    ScriptedProvider,
    ToolCall,
    run_args,
    start_tether,
    tether,
    wait_for,
    workspace_tree,
)
from support.tier import examples
from test_launch import alive, make_config, placement
from tether.cli import entry, run_start
from tether.cli.app import app, load_command
from tether.cli.run_start import RunArgs, parse
from tether.config import Config
from tether.files import DISCARDED_DIR
from tether.ledger import RunStatus, open_ledger
from tether.pi import keeper
from tether.pi.launch import runs_dir

RUN = load_command("run")


class _Started(Exception):
    def __init__(self, args: RunArgs) -> None:
        self.args_seen = args


def command_args(argv: list[str], before: Sequence[str] = ()) -> RunArgs | None:
    """The arguments the `run` command itself would start the run with (typer's own parsing of
    ``tether BEFORE run ARGV``), or None when it rejects them."""

    def seen(args: RunArgs, **_: object) -> None:
        raise _Started(args)

    original = run_start.start
    run_start.start = seen  # type: ignore[assignment]
    try:
        result = CliRunner().invoke(app, [*before, "run", *argv])
    finally:
        run_start.start = original
    return result.exception.args_seen if isinstance(result.exception, _Started) else None


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


@settings(max_examples=examples(300, unit=50), deadline=None)
@given(run_argv())
def test_a_head_start_is_made_only_for_what_the_command_reads_the_same_way(
    argv: list[str],
) -> None:
    guessed = parse(argv)
    if guessed is not None:
        # `tether` runs these without the command: it must read them exactly as the command does.
        assert command_args(argv) == guessed
    if "--help" not in argv and "--sess" not in argv:
        assert guessed == command_args(argv)
    else:
        assert guessed is None


def program_args(argv: list[str]) -> RunArgs | None:
    """What the program (``tether.cli.entry``) reads from ``tether ARGV`` to run it without the
    CLI: the options before the command, then ``run``'s own; None when it leaves them to the
    CLI."""
    split = entry.split_globals(argv)
    if split is None or split[1][:1] != ["run"]:
        return None
    given, words = split
    return parse(words[1:], config=given.get("--config"), ledger=given.get("--ledger"))


def test_the_program_knows_every_option_of_the_root() -> None:
    from tether.cli.app import app as root_app

    group = typer.main.get_group(root_app)
    spelled = {f"--{name.rstrip('=')}" for name in entry.GLOBAL_LONG_OPTIONS}
    shorts = {f"-{c}" for c in entry.GLOBAL_SHORT_OPTIONS.replace(":", "")}
    options = [p for p in group.params if p.param_type_name == "option"]
    taken = [p for p in options if p.name in ("config", "ledger")]
    assert len(taken) == 2
    for param in taken:
        assert set(param.opts) <= spelled | shorts, param.opts


@st.composite
def before_run(draw: st.DrawFn) -> list[str]:
    """Options given before ``run`` in any spelling, sometimes with a mistake."""
    words: list[str] = []
    for long, short in (("--config", "-c"), ("--ledger", None)):
        for _ in range(draw(st.integers(0, 2))):  # twice: the last one applies
            value = draw(VALUES)
            style = draw(st.sampled_from(["long", "equals", "short", "joined"]))
            if style == "short" and short is not None:
                words += [short, value]
            elif style == "joined" and short is not None:
                words.append(short + value)
            elif style == "equals":
                words.append(f"{long}={value}")
            else:
                words += [long, value]
    if draw(st.integers(0, 9)) == 0:
        mistake = draw(st.sampled_from(["--conf", "--help", "--", "--json", "-s"]))
        words.insert(draw(st.integers(0, len(words))), mistake)
    return words


@settings(max_examples=examples(200, unit=40), deadline=None)
@given(before_run(), run_argv())
def test_options_before_run_are_read_as_the_cli_reads_them(
    before: list[str], argv: list[str]
) -> None:
    guessed = program_args([*before, "run", *argv])
    if guessed is not None:
        assert command_args(argv, before) == guessed
    plain = not {"--conf", "--help", "--", "--json", "-s"} & set(before)
    if plain and "--help" not in argv and "--sess" not in argv:
        assert guessed == command_args(argv, before)


@pytest.mark.parametrize(
    ("before", "argv", "config", "ledger"),
    [
        (["--config", "a.toml"], ["-s", "s1", "-a", "rev", "hi"], "a.toml", None),
        (["-cA.toml", "--ledger=memory:"], ["-s", "s1", "-a", "rev", "hi"], "A.toml", "memory:"),
        # the option after the command applies
        (["--config", "a.toml"], ["-c", "b.toml", "-s", "s1", "-a", "r", "hi"], "b.toml", None),
        (
            ["--ledger", "memory:"],
            ["--ledger", "sqlite:x", "-s", "s", "-a", "r", "hi"],
            None,
            "sqlite:x",
        ),
    ],
)
def test_config_and_ledger_before_run(
    before: list[str], argv: list[str], config: str | None, ledger: str | None
) -> None:
    guessed = program_args([*before, "run", *argv])
    assert guessed is not None
    assert (guessed.config, guessed.ledger) == (Path(config) if config else None, ledger)
    assert guessed == command_args(argv, before)


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
    """The run directories (not what was set aside to be removed: ``.discarded``)."""
    where = runs_dir(config)
    return sorted(p for p in where.iterdir() if p.name != DISCARDED_DIR) if where.exists() else []


def test_an_abandoned_head_start_leaves_nothing(config: Config) -> None:
    argv = ["--config", str(config.path), "-s", "s1", "-a", "rev", "--json", "hello"]
    head = run_start.head_start(argv)
    assert head is not None
    assert head.launch is not None
    assert (head.text, head.args.as_json, head.args.wait) == ("hello", True, True)
    wait_for(lambda: (head.launch.run_dir / keeper.PLACEMENT_NAME).exists(), 10, "keeper")
    pi_pid = placement(head.launch.run_dir)["pi_pid"]
    head.abandon()
    assert not alive(pi_pid), "pi of the abandoned start still runs"
    assert _run_dirs(config) == []


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
    assert run_start.head_start(["--config", str(config.path), *argv]) is None
    assert not runs_dir(config).exists()
    assert config.path is not None
    assert not (config.path.parent / "ledger.db").exists()


def test_a_head_start_the_run_never_takes_is_abandoned(config: Config) -> None:
    # The program made the start, then failed before the run took it (here: the run's module
    # cannot be imported): pi ends at its gate and its directory is removed.
    code = textwrap.dedent(
        f"""
        import sys
        from tether.cli import entry
        sys.modules["tether.cli.run_live"] = None  # importing it raises ImportError
        sys.argv = ["tether", "run", "-c", {str(config.path)!r}, "-s", "s1", "-a", "rev", "hi"]
        entry.main()
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "import of tether.cli.run_live halted" in done.stderr
    assert _run_dirs(config) == []
    where = str(runs_dir(config))
    # (info, not cmdline(): another test's zombie must not fail this one)
    strays = [
        p for p in psutil.process_iter(["cmdline"]) if where in " ".join(p.info["cmdline"] or [])
    ]
    assert strays == []


def test_tether_run_takes_its_head_start(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    provider = scripted_provider([Reply("the answer")])
    cfg = make_config(tmp_path, provider.url)
    assert cfg.path is not None
    argv = run_args(cfg.path, "what is it?", as_json=True)
    done = tether(*argv, cwd=tmp_path, env={"PYTHONWARNINGS": "error::ResourceWarning"})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["answer"]) == ("finished", "the answer")
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as store:
        runs = store.runs("s1")
    assert [(r.id, r.status) for r in runs] == [(out["run"], RunStatus.FINISHED)]
    assert _run_dirs(cfg) == [], "one run, one directory, removed after a good end"


def test_plain_arguments_run_without_loading_the_cli(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    provider = scripted_provider([Reply("the answer"), Reply("again")])
    cfg = make_config(tmp_path, provider.url)

    def loaded(*argv: str, stdin: str = "") -> tuple[subprocess.CompletedProcess[str], set[str]]:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "tether", "run", "-c", str(cfg.path), *argv],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
        return done, {name.split(".")[0] for name in names if "import time:" not in name}

    done, modules = loaded("-s", "s1", "-a", "rev", "--json", "what is it?")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "the answer"
    assert not modules & {"typer", "click", "rich"}, "the CLI was loaded for plain arguments"
    # Arguments that are not plain (here, the request on stdin) go to the command.
    done, modules = loaded("-s", "s1", "-a", "rev", "--json", "-", stdin="and now?")
    assert "typer" in modules
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "again"


def _tether_run(tmp_path: Path, cfg: Config, *args: str) -> subprocess.CompletedProcess[str]:
    assert cfg.path is not None
    return tether(*run_args(cfg.path, *args, as_json=True), cwd=tmp_path)


def test_without_custody_the_run_starts_its_own_pi(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    # The bash tool holds until the test has read, from the host's /proc, the processes it
    # descends from (inside the sandbox's PID namespace its parents are not the host's).
    go = workspace_tree(tmp_path) / "go"  # the session's workspace: what the tool sees
    hold = f"touch held; while [ ! -e {go} ]; do sleep 0.05; done; echo held-tool"
    provider = scripted_provider(
        [Reply(tool_calls=[ToolCall("bash", {"command": hold})]), Reply("ok")]
    )
    cfg = make_config(tmp_path, provider.url)
    assert cfg.path is not None
    cfg.path.write_text(cfg.path.read_text() + "\n[custody]\ndetached = false\n")
    cli = start_tether(*run_args(cfg.path, "go", as_json=True), cwd=tmp_path)
    try:
        wait_for(lambda: (workspace_tree(tmp_path) / "held").exists(), what="the tool to run")
        tool = next(
            p
            for p in psutil.process_iter(["cmdline"])
            if "held-tool" in " ".join(p.info["cmdline"] or []) and "bash" in p.info["cmdline"][0]
        )
        ancestors = [(p.pid, " ".join(p.cmdline())) for p in tool.parents()]
    finally:
        go.touch()
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    assert json.loads(out)["status"] == "finished"
    # No head start under a keeper: pi (and so its tool) descends from the CLI's own process.
    pids = [pid for pid, _ in ancestors]
    assert cli.pid in pids
    # Between the tool and the CLI (not above it: the test runner's command line may name
    # anything, tests/test_keeper.py say).
    below = ancestors[: pids.index(cli.pid)]
    assert not any("keeper" in cmdline for _, cmdline in below), below
    assert _run_dirs(cfg) == []


def test_workdir_on_the_command_line_is_the_session_s_template_and_is_checked(
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
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "from-elsewhere").write_text("x")
    done = _tether_run(tmp_path, cfg, "--workdir", str(elsewhere), "go")
    assert done.returncode == 0, done.stderr
    # The session's workspace is made from it; the tools work there, not in it.
    assert (workspace_tree(tmp_path) / "made-here").exists()
    assert (workspace_tree(tmp_path) / "sub" / "from-elsewhere").exists()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["sub"]
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


def test_loading_collects_nothing_then_freezes_what_it_made() -> None:
    seen: list[int] = []

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    frozen = gc.get_freeze_count()
    gc.callbacks.append(collected)
    try:
        with entry.loading():
            assert not gc.isenabled()
            # Containers far past the first generation's threshold (700): enabled, the
            # collector would run dozens of times here.
            made = [[i] for i in range(50_000)]
        assert gc.isenabled()
        assert seen == []
        assert gc.get_freeze_count() >= frozen + len(made)
        with pytest.raises(RuntimeError), entry.loading():
            raise RuntimeError("a module that fails to load")
        assert gc.isenabled(), "a failed load leaves the collector on"
    finally:
        gc.callbacks.remove(collected)
        gc.unfreeze()


# Loaded by every `python` started with its directory on the path: writes how many collections
# of each generation the process ran, and how many objects it has frozen, as it exits and on
# SIGUSR1 (uvicorn ends `tether serve` by raising the SIGTERM it caught again: no exit handlers).
PROBE = """
import atexit, gc, json, os, signal
counts = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == "stop" and counts.__setitem__(
    info["generation"], counts[info["generation"]] + 1))
def report(*_):
    with open(os.environ["GC_PROBE_OUT"], "a") as f:
        f.write(json.dumps(
            {"pid": os.getpid(), "collections": counts, "frozen": gc.get_freeze_count(),
             "enabled": gc.isenabled()}
        ) + "\\n")
atexit.register(report)
signal.signal(signal.SIGUSR1, report)
"""


def test_the_program_freezes_what_it_loaded(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    """``tether run`` (its head start) and the CLI's commands load their modules with the
    collector off, and freeze them; a run then goes on collecting."""
    provider = scripted_provider([Reply("the answer")])
    cfg = make_config(tmp_path, provider.url)
    assert cfg.path is not None
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(PROBE)
    out = tmp_path / "gc.jsonl"
    env: dict[str, str | None] = {"PYTHONPATH": str(tmp_path / "probe"), "GC_PROBE_OUT": str(out)}
    done = tether(*run_args(cfg.path, "what is it?", as_json=True), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    listed = tether("sessions", "-c", str(cfg.path), cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    run, cli = (json.loads(line) for line in out.read_text().splitlines())
    # tether's modules, msgspec's, anyio's … about 25,000 objects; without the freeze, none.
    assert run["frozen"] > 10_000, run
    assert cli["frozen"] > 10_000, cli
    assert run["enabled"], run
    assert cli["enabled"], cli
    # Loading set off about 50 collections: the run's own are a few.
    assert sum(run["collections"]) < 25, run
