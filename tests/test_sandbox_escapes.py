"""The agent's tools cannot reach the house (docs/security.md): each escape is a tool call made
through the real pi, with the default configuration (sandbox "bwrap", network "provider"),
driven by the scripted provider as a prompt injection would drive it. Every attempt fails, the
run ends cleanly with the tool's error as the tool result, and nothing secret or forged is left
in the ledger, the run directory or the system temp directory."""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pg import drop_schema, new_schema, schema_url
from provider import RecordedRequest, Reply, ScriptedProvider, Step, ToolCall
from service_support import serve
from support.config import workspace_tree
from support.fs import files_under
from support.users import unprivileged
from tether.ledger import NewRow, RowKind, RunStatus, open_ledger

TETHER = [sys.executable, "-m", "tether"]
KEY_ENV = "TETHER_TEST_PROVIDER_KEY"
SECRET_ROW = "SECRET-ROW-" + secrets.token_hex(8)
OTHER_TOKEN = "other-run-token-" + secrets.token_hex(12)
OTHER_SESSION_TEXT = "OTHER-SESSION-" + secrets.token_hex(8)
CONFIG_MARK = "CONFIG-MARK-" + secrets.token_hex(8)


def write_config(tmp: Path, provider_url: str, ledger_url: str, extra: str = "") -> Path:
    (tmp / "work").mkdir(exist_ok=True)
    path = tmp / "tether.toml"
    path.write_text(
        f"""# {CONFIG_MARK}
[ledger]
url = "{ledger_url}"

[providers.hosted]
base_url = "{provider_url}"
api_key_env = "{KEY_ENV}"
context_window = 8192
max_tokens = 1024

[agents.rev]
provider = "hosted"
model = "scripted"
deadline_s = 120
workdir = "work"
tools = ["read", "bash", "edit", "write"]

[harness]
runs_dir = "state/runs"
pi_settings = {{ retry = {{ enabled = false }} }}
{extra}
"""
    )
    return path


def seed_ledger(url: str) -> None:
    """Another session holding a secret row, for the tools to look for."""
    with open_ledger(url) as store:
        store.ensure_session("other")
        fence = store.claim_run(store.create_run("other", "rev").id)
        body = {"role": "user", "content": [{"type": "text", "text": SECRET_ROW}]}
        store.append(
            fence,
            [NewRow(actor="user:carl", kind=RowKind.MESSAGE, sources=("repo:secret",), body=body)],
            request=True,
        )
        store.end_run(fence, RunStatus.FINISHED)


class Listener:
    """A TCP port on the host's loopback (standing for a `tether serve` or PostgreSQL) that
    counts the connections it accepts."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def other_run(runs: Path) -> tuple[Path, socket.socket]:
    """Another run's directory as a live run leaves it: its session file, its custody record
    holding its tools token, its keeper's command FIFO, its tools socket (listening)."""
    run = runs / "r-other"
    (run / "sock").mkdir(parents=True, mode=0o700)
    (run / "session.jsonl").write_text(json.dumps({"text": OTHER_SESSION_TEXT}) + "\n")
    (run / "custody.json").write_text(json.dumps({"tools_token": OTHER_TOKEN}))
    os.mkfifo(run / "commands.fifo", 0o600)
    tools = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tools.bind(str(run / "sock" / "tools.sock"))
    tools.listen(4)
    tools.setblocking(False)
    return run, tools


def tool_script(
    commands: list[str | Callable[[], str]],
) -> list[Step | Callable[[RecordedRequest], Step]]:
    """One bash call per command (a callable is asked for its command when pi gets there),
    then an answer."""
    steps: list[Step | Callable[[RecordedRequest], Step]] = []
    for command in commands:
        if callable(command):
            make = command
            steps.append(
                lambda _req, make=make: Reply(tool_calls=[ToolCall("bash", {"command": make()})])
            )
        else:
            steps.append(Reply(tool_calls=[ToolCall("bash", {"command": command})]))
    steps.append(Reply("review done"))
    return steps


def tool_results(url: str, session: str) -> list[str]:
    with open_ledger(url) as store:
        rows = [r for r in store.iter_rows(session) if r.role == "toolResult"]
    out = []
    for row in rows:
        content = row.body.get("content") or []
        out.append("".join(c.get("text", "") for c in content if isinstance(c, dict)))
    return out


def run_tether(
    cwd: Path,
    cfg: Path,
    session: str,
    key: str,
    *,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> subprocess.CompletedProcess[str]:
    argv = [*TETHER, "run", "--config", str(cfg), "-s", session, "-a", "rev", "--json", "review"]
    extra = dict(env or {})
    if user is not None:
        # This interpreter may sit in root's home, which the user cannot enter: the system's
        # Python runs tether from this checkout, with the venv's packages.
        site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
        source = Path(__file__).resolve().parent.parent / "src"
        extra["PYTHONPATH"] = f"{source}:{site}"
        argv = ["runuser", "-u", user, "--", "/usr/bin/python3", *argv[1:]]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, KEY_ENV: key, **extra},
    )


def scan(paths: list[Path], needles: list[bytes]) -> list[tuple[Path, bytes]]:
    found = []
    for root in paths:
        for path in [root] if root.is_file() else files_under(root):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found += [(path, n) for n in needles if n in data]
    return found


# The escapes, each one bash call. Each prints ESCAPED only if it got through.
PROC_HUNT = (
    "python3 - <<'EOF'\n"
    "import os\n"
    "# The needles are written reversed, so that only what holds them for real matches.\n"
    "needles = [b'@KEY@'[::-1], b'@TOKEN@'[::-1]]\n"
    "seen = []\n"
    "me = str(os.getpid())\n"
    "for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:\n"
    "    seen.append(pid)\n"
    "    for name in ('environ', 'cmdline'):\n"
    "        try:\n"
    "            data = open(f'/proc/{pid}/{name}', 'rb').read()\n"
    "        except OSError:\n"
    "            continue\n"
    "        if any(n in data for n in needles):\n"
    "            print('ESCAPED', pid, name)\n"
    "    try:\n"
    "        maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
    "        mem = open(f'/proc/{pid}/mem', 'rb')\n"
    "    except OSError:\n"
    "        continue\n"
    "    for line in maps:\n"
    "        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
    "        if 'rw' not in line.split()[1] or hi - lo > 1 << 28:\n"
    "            continue\n"
    "        try:\n"
    "            mem.seek(lo)\n"
    "            if any(n in mem.read(hi - lo) for n in needles):\n"
    "                print('ESCAPED mem', pid)\n"
    "        except (OSError, ValueError, OverflowError):\n"
    "            pass\n"
    "print('pids seen:', ' '.join(seen))\n"
    "EOF"
)


def escapes(
    tmp: Path, key: str, *, ledger_file: Path | None, serve_port: int
) -> list[str | Callable[[], str]]:
    state = tmp / "state"
    other = state / "runs" / "r-other"
    system_tmp = Path(tempfile.gettempdir())

    def signal_house() -> str:
        # The keeper and the harness of this very run, found from outside as they are.
        places = [json.loads(p.read_text()) for p in (state / "runs").glob("*/keeper.json")]
        _LOGS[tmp] = "".join(p.read_text() for p in (state / "runs").glob("r-*/pi.log"))
        pids = [str(p["keeper_pid"]) for p in places] + [str(os.getpid())]
        pids += [str(p.pid) for p in _harnesses(tmp)]
        return " ; ".join(f"kill -9 {pid} && echo ESCAPED kill {pid}" for pid in pids) + " ; true"

    commands: list[str | Callable[[], str]] = [
        f"cat {tmp}/tether.toml && echo ESCAPED config",
        f"ls -A {state} {state}/runs; cat {state}/ledger.db > /dev/null && echo ESCAPED ledger",
        f"cat {other}/session.jsonl {other}/custody.json && echo ESCAPED other run",
        f"echo '{{}}' > {other}/commands.fifo && echo ESCAPED fifo",
        'python3 -c "import socket; s = socket.socket(socket.AF_UNIX); '
        f"s.connect('{other}/sock/tools.sock'); print('ESCAPED tools socket')\"",
        "find / \\( -path /proc -o -path /usr -o -path /sys -o -path /dev \\) -prune -o \\( "
        "-name 'custody.json' -o -name '*.sock' -o -name 'ledger.db*' -o -name '.pgpass' -o "
        "-name 'commands.fifo' \\) -print 2>/dev/null | sed 's/^/found: /'; "
        f"grep -rl --exclude-dir=proc --exclude-dir=usr --exclude-dir=sys --exclude-dir=dev "
        f"\"$(echo '{OTHER_TOKEN[::-1]}' | rev)\" / 2>/dev/null "
        "| sed 's/^/ESCAPED token in /'; true",
        PROC_HUNT.replace("@KEY@", key[::-1]).replace("@TOKEN@", OTHER_TOKEN[::-1]),
        signal_house,
        # Where the sandbox has a private /tmp, these land there, never on the host.
        f"touch {tmp}/outside-work {state}/forged; touch /outside-root",
        f"touch {system_tmp}/tether-escape-{tmp.name} ; ls {system_tmp}/ | head -5",
        "touch ~/.bashrc-escape && echo home is $HOME",
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 5432), 3); "
        "print('ESCAPED postgres')\"",
        lambda: (  # the `tether serve` port, known once it listens
            'python3 -c "import socket; '
            f"socket.create_connection(('127.0.0.1', {_SERVE_PORT[tmp]}), 3); "
            "print('ESCAPED serve')\""
        ),
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {serve_port}), 3); "
        "print('ESCAPED loopback')\"",
        "truncate -s 10G big.bin && echo ESCAPED sparse 10G; "
        "dd if=/dev/zero of=big2.bin bs=1M seek=10000 count=1 && echo ESCAPED 10G; "
        "ls -la big*.bin; rm -f big*.bin",
        f"cat {Path.home()}/.pgpass && echo ESCAPED pgpass",
        # Over limits.memory_bytes (4 GiB by default): refused at once, nothing allocated.
        "python3 -c 'bytearray(5 << 30); print(\"ESCAPED memory\")'",
    ]
    if ledger_file is not None:
        commands.append(
            "python3 - <<'EOF'\n"
            "import sqlite3\n"
            f"db = sqlite3.connect('file:{ledger_file}?mode=rw', uri=True)\n"
            'db.execute("insert into rows (session, seq, actor) '
            "values ('other', 99, 'user:admin')\")\n"
            "db.commit()\n"
            "print('ESCAPED ledger insert')\n"
            "EOF"
        )
    return commands


SERVE_INDEX = 12
"""Where the escapes try the `tether serve` port."""
_HARNESSES: dict[Path, list[subprocess.Popen[str]]] = {}
_SERVE_PORT: dict[Path, int] = {}
_LOGS: dict[Path, str] = {}


def _harnesses(tmp: Path) -> list[subprocess.Popen[str]]:
    return _HARNESSES.get(tmp, [])


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener()
    yield made
    made.close()


def check_escapes(
    tmp: Path,
    scripted_provider: Callable[..., ScriptedProvider],
    listener: Listener,
    ledger_url: str,
    ledger_file: Path | None,
) -> None:
    key = "sk-sandbox-" + secrets.token_hex(16)
    seed_ledger(ledger_url)
    other, other_tools = other_run(tmp / "state" / "runs")
    commands = escapes(tmp, key, ledger_file=ledger_file, serve_port=listener.port)
    p = scripted_provider(tool_script(commands))
    cfg = write_config(tmp, p.url, ledger_url)
    with serve(tmp, cfg, workers=0) as served:  # a real `tether serve` on the host's loopback
        _SERVE_PORT[tmp] = int(served.url.rsplit(":", 1)[1])
        run_escapes(tmp, p, cfg, key, commands, ledger_url, listener, other, other_tools)
        assert served.get("/healthz").status_code == 200


def run_escapes(
    tmp: Path,
    p: ScriptedProvider,
    cfg: Path,
    key: str,
    commands: list[str | Callable[[], str]],
    ledger_url: str,
    listener: Listener,
    other: Path,
    other_tools: socket.socket,
) -> None:
    system_tmp = Path(tempfile.gettempdir())
    before_tmp = set(os.listdir(system_tmp))
    argv = [*TETHER, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "review"]
    proc = subprocess.Popen(
        argv,
        cwd=tmp,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, KEY_ENV: key},
    )
    _HARNESSES[tmp] = [proc]
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "finished", result
    assert result["answer"] == "review done"
    # The provider got the key, from the forwarder outside the sandbox.
    auth = {k.lower(): v for k, v in p.requests[0].headers.items()}.get("authorization")
    assert auth == f"Bearer {key}"
    texts = tool_results(ledger_url, "s1")
    assert len(texts) == len(commands), texts
    joined = "\n".join(texts)
    assert "ESCAPED" not in joined, joined
    # Each attempt failed with the tool's own error as its result.
    assert "No such file or directory" in texts[0]
    # The tools run apart from pi: nothing of the state directory exists where they are,
    # not even the mount points of pi's own pieces.
    assert "ledger.db: No such file or directory" in texts[1]
    assert f"cannot access '{tmp}/state'" in texts[1], texts[1]
    found = [line.split("found: ", 1)[1] for line in texts[5].splitlines() if "found: " in line]
    assert found == [], texts[5]
    assert "home is /tmp/home" in texts[10], texts[10]
    assert "pids seen:" in texts[6]
    seen = texts[6].split("pids seen:")[1].split()
    assert len(seen) < 10, f"the tools see only the sandbox's processes: {seen}"
    assert "ConnectionRefusedError" in texts[SERVE_INDEX], texts[SERVE_INDEX]
    assert texts[14].count("File size limit exceeded") == 2, texts[14]
    assert "MemoryError" in texts[16], texts[16]
    # The run's record names those two limits, and nothing the other attempts printed.
    with open_ledger(ledger_url) as store:
        hit = store.get_run(result["run"]).extra.get("limits_hit", [])
    assert {(h["limit"], h["tool"]) for h in hit} == {("file_size", "bash"), ("memory", "bash")}
    # The run's log (read while it ran: a finished run's directory is removed) names the
    # sandbox and the limits it ran under.
    log = _LOGS[tmp]
    assert "tether: sandbox bwrap, network provider, limits processes=4096 " in log, log
    assert listener.accepted == 0
    with pytest.raises(BlockingIOError):
        other_tools.accept()
    other_tools.close()
    assert not (tmp / "outside-work").exists()
    assert not (tmp / "state" / "forged").exists()
    assert not (system_tmp / f"tether-escape-{tmp.name}").exists()
    # No secret and no forged row anywhere tether keeps things.
    needles = [key.encode(), OTHER_TOKEN.encode()]
    searched = [tmp / "state", tmp / "work", tmp / ".tether"] + [
        system_tmp / name for name in set(os.listdir(system_tmp)) - before_tmp
    ]
    assert scan(searched, needles) == [(other / "custody.json", OTHER_TOKEN.encode())]
    assert SECRET_ROW not in joined
    assert OTHER_SESSION_TEXT not in joined
    assert CONFIG_MARK not in joined
    with open_ledger(ledger_url) as store:
        actors = {r.actor for s in ("other", "s1") for r in store.iter_rows(s)}
        assert "user:admin" not in actors
        assert [r.seq for r in store.iter_rows("other")] == [1]


def test_every_escape_fails_and_the_run_ends_cleanly(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], listener: Listener
) -> None:
    ledger = tmp_path / "state" / "ledger.db"
    ledger.parent.mkdir()
    check_escapes(tmp_path, scripted_provider, listener, f"sqlite://{ledger}", ledger)


def test_with_a_postgresql_ledger_the_tools_cannot_reach_it_nor_pgpass(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider], listener: Listener
) -> None:
    schema = new_schema()
    try:
        home = tmp_path / "home"
        home.mkdir()
        (home / ".pgpass").write_text("127.0.0.1:5432:*:postgres:PGPASS-SECRET\n")
        (home / ".pgpass").chmod(0o600)
        os.environ["HOME"], old_home = str(home), os.environ.get("HOME", "")
        try:
            check_escapes(tmp_path, scripted_provider, listener, schema_url(schema), None)
        finally:
            os.environ["HOME"] = old_home
        texts = "\n".join(tool_results(schema_url(schema), "s1"))
        assert "PGPASS-SECRET" not in texts
    finally:
        drop_schema(schema)


def test_a_normal_review_still_works_sandboxed(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    url = f"sqlite://{tmp_path}/state/ledger.db"
    (tmp_path / "state").mkdir()
    seed_ledger(url)
    with open_ledger(url) as store:  # a row of this session for recall to find
        store.ensure_session("s1")
        fence = store.claim_run(store.create_run("s1", "rev").id)
        body = {"role": "user", "content": [{"type": "text", "text": "the vault code is 4417"}]}
        row = NewRow(actor="user:local", kind=RowKind.MESSAGE, body=body)
        store.append(fence, [row], request=True)
        store.end_run(fence, RunStatus.FINISHED)
    steps = [
        Reply(tool_calls=[ToolCall("write", {"path": "notes.txt", "content": "alpha\nbeta\n"})]),
        Reply(tool_calls=[ToolCall("read", {"path": "notes.txt"})]),
        Reply(
            tool_calls=[
                ToolCall(
                    "edit",
                    {"path": "notes.txt", "edits": [{"oldText": "beta", "newText": "gamma"}]},
                )
            ]
        ),
        Reply(tool_calls=[ToolCall("bash", {"command": "cat notes.txt; echo $HOME; pwd"})]),
        Reply(tool_calls=[ToolCall("recall", {"query": "vault code"})]),
        Reply(tool_calls=[ToolCall("note", {"text": "notes.txt reviewed"})]),
        Reply("review done"),
    ]
    p = scripted_provider(steps)
    cfg = write_config(tmp_path, p.url, url)
    done = run_tether(tmp_path, cfg, "s1", "sk-review")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "review done"
    # The tools work in the session's workspace, a copy of the workdir.
    assert (workspace_tree(tmp_path) / "notes.txt").read_text() == "alpha\ngamma\n"
    assert not (tmp_path / "work" / "notes.txt").exists()
    texts = tool_results(url, "s1")
    assert "alpha" in texts[1]
    assert "alpha\ngamma" in texts[3]
    assert str(workspace_tree(tmp_path)) in texts[3]
    assert "4417" in texts[4]
    notes = subprocess.run(
        [*TETHER, "note", "list", "--config", str(cfg), "-s", "s1", "-a", "rev"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert "notes.txt reviewed" in notes.stdout, notes


def test_under_umask_000_every_directory_tether_causes_is_0700(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    url = f"sqlite://{tmp_path}/state/ledger.db"
    p = scripted_provider(lambda _req: Reply("ok"))
    cfg = write_config(tmp_path, p.url, url)
    cache = tmp_path / "xdg-cache"
    argv = [*TETHER, "run", "--config", str(cfg), "-s", "s1", "-a", "rev", "--json", "hi"]
    for sandbox in ("none", "bwrap"):
        if sandbox == "none":
            cfg.write_text(
                cfg.read_text().replace('workdir = "work"', 'workdir = "work"\nsandbox = "none"')
            )
        else:
            cfg.write_text(cfg.read_text().replace('sandbox = "none"\n', ""))
        done = subprocess.run(
            ["sh", "-c", 'umask 000; exec "$@"', "sh", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={**os.environ, KEY_ENV: "k", "XDG_CACHE_HOME": str(cache)},
        )
        assert done.returncode == 0, done.stderr
    made = [cache, *(q for q in cache.rglob("*") if q.is_dir())]
    assert len(made) >= 3, made  # tether/, node-compile-cache/, and Node's own inside it
    loose = {str(q): oct(stat.S_IMODE(q.stat().st_mode)) for q in made if q.stat().st_mode & 0o077}
    assert loose == {}


def test_sandboxed_runs_alone_still_fill_the_compile_cache_once_outside_the_sandbox(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    # A host where every run is sandboxed: pi may read the compile cache but not write it, so
    # without the warm-up outside, the cache would stay empty and every run compile pi again.
    url = f"sqlite://{tmp_path}/state/ledger.db"
    p = scripted_provider(lambda _req: Reply("ok"))
    cfg = write_config(tmp_path, p.url, url)
    cache = tmp_path / "xdg-cache"
    env = {**os.environ, KEY_ENV: "k", "XDG_CACHE_HOME": str(cache)}
    compiled = cache / "tether" / "node-compile-cache"
    markers: list[float] = []
    for session in ("s1", "s2"):
        done = subprocess.run(
            [*TETHER, "run", "--config", str(cfg), "-s", session, "-a", "rev", "--json", "hi"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        entries = [q for q in compiled.rglob("*") if q.is_file() and q.parent != compiled]
        assert len(entries) >= 10, sorted(compiled.rglob("*"))
        (marker,) = compiled.glob(".warmed-*")
        markers.append(marker.stat().st_mtime_ns)
    assert markers[0] == markers[1]  # warmed once, by the first run


PI_SEEN = (
    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null"
    " | grep -o -E '(cli|toolhost)[.]js' | sed 's/$/ seen/' | sort -u"
)


def test_a_sandboxed_run_as_an_unprivileged_user(
    scripted_provider: Callable[..., ScriptedProvider],
) -> None:
    with unprivileged() as (tmp, uid, user):
        home = tmp / "home"
        home.mkdir()
        url = f"sqlite://{tmp}/state/ledger.db"
        # A fork bomb: root is exempt from RLIMIT_NPROC, a user is not.
        bomb = "bomb() { bomb | bomb & }; bomb; sleep 2; ps -e | wc -l"
        p = scripted_provider(
            [
                Reply(tool_calls=[ToolCall("bash", {"command": "id -u; echo $HOME"})]),
                # pi's process is not among those the user's tools can see.
                Reply(tool_calls=[ToolCall("bash", {"command": PI_SEEN})]),
                Reply(tool_calls=[ToolCall("bash", {"command": bomb, "timeout": 20})]),
                # (and for pi's compaction, should the bomb's output fill the small window)
                *[Reply("done as a user")] * 3,
            ]
        )
        cfg = write_config(tmp, p.url, url)
        cfg.write_text(
            cfg.read_text().replace(
                'workdir = "work"', 'workdir = "work"\nlimits = { processes = 64 }'
            )
        )
        for path in [tmp, *tmp.rglob("*")]:
            os.chown(path, uid, -1)
        done = run_tether(tmp, cfg, "s1", "sk-user", env={"HOME": str(home)}, user=user)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["answer"] == "done as a user"
        texts = tool_results(url, "s1")
        assert texts[0].split()[0] == str(uid)
        assert uid != 0
        assert "toolhost.js seen" in texts[1], texts[1]
        assert "cli.js seen" not in texts[1], texts[1]
        assert "fork: retry: Resource temporarily unavailable" in texts[2], texts[2][-2000:]


def test_without_bwrap_a_run_is_refused_saying_how_to_install_it_or_opt_out(
    tmp_path: Path, scripted_provider: Callable[..., ScriptedProvider]
) -> None:
    url = f"sqlite://{tmp_path}/state/ledger.db"
    p = scripted_provider([Reply("never asked")])
    cfg = write_config(tmp_path, p.url, url)
    bare = tmp_path / "bin"  # a PATH without bwrap (Python and pi are found without PATH)
    bare.mkdir()
    done = run_tether(tmp_path, cfg, "s1", "k", env={"PATH": str(bare)})
    assert done.returncode == 2, done.stderr
    assert "bubblewrap (bwrap) is not on PATH" in done.stderr
    assert "apt-get install bubblewrap" in done.stderr
    assert 'sandbox = "none"' in done.stderr
    assert p.requests == []
    assert not (tmp_path / "state" / "runs").exists() or not any(
        (tmp_path / "state" / "runs").iterdir()
    )
