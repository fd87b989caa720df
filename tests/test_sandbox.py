"""The sandbox's pieces on their own (docs/security.md): what bubblewrap is told to show, the
forwarder's rewrite of pi's request head, and pi's provider URL when sandboxed. The escapes
themselves, through the real pi, are in test_sandbox_escapes.py."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from tether.config import LimitsConfig, NetworkKind, parse_config
from tether.errors import ConfigError
from tether.pi.agentdir import NO_KEY, write_agent_dir
from tether.sandbox.bwrap import PROVIDER_ORIGIN, Confinement, split_base_url
from tether.sandbox.limits import (
    MAX_PER_LIMIT,
    LimitHit,
    LimitWatch,
    SandboxLimit,
    limits_in,
    limits_text,
    recorded_limits,
)
from tether.sandbox.outside import _Api, _parse_upstream, _Refusal, _upstream_request


def confinement(tmp: Path, network: NetworkKind = NetworkKind.PROVIDER) -> Confinement:
    run = tmp / "state" / "runs" / "r-1"
    return Confinement(
        bwrap="/usr/bin/bwrap",
        network=network,
        limits=LimitsConfig(processes=7, memory_bytes=8 << 20, file_size_bytes=9 << 20),
        workdir=tmp / "work",
        read_only=(Path("/usr/lib/node"), tmp / "node_modules"),
        writable=(run / "home", run / "tmp", run / "agent", run / "pi-session", run / "sock"),
        provider_socket=run / "sock" / "provider.sock",
        upstream="http://127.0.0.1:9",
        api="anthropic-messages",
        base_path="/anthropic",
    )


def binds(argv: list[str]) -> list[tuple[str, str]]:
    return [(argv[i], argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in ("--bind", "--ro-bind")]


def test_the_sandbox_shows_the_workdir_and_the_run_s_own_pieces_and_nothing_else(
    tmp_path: Path,
) -> None:
    c = confinement(tmp_path)
    argv = c.argv(["node", "pi"])
    outside, bwrap = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert outside[3].endswith("sandbox/outside.py")
    assert outside[outside.index("--socket") + 1] == str(c.provider_socket)
    # The forwarder passes on the provider api's requests only, under the base URL's path.
    assert outside[outside.index("--api") + 1] == "anthropic-messages"
    assert outside[outside.index("--base-path") + 1] == "/anthropic"
    assert [outside[i + 1] for i, a in enumerate(outside) if a == "--limit"] == [
        "nproc=7",
        f"data={8 << 20}",
        f"fsize={9 << 20}",
    ]
    assert bwrap[0] == "/usr/bin/bwrap"
    assert bwrap[-3:] == ["--", "node", "pi"]
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"):
        assert flag in bwrap
    assert "--die-with-parent" in bwrap
    assert bwrap[bwrap.index("--chdir") + 1] == str(tmp_path / "work")
    assert bwrap[bwrap.index("--tmpfs") - 2 : bwrap.index("--tmpfs")] == ["--size", str(9 << 20)]
    rw = {src for flag, src in binds(bwrap) if flag == "--bind"}
    assert rw == {str(p) for p in (*c.writable, c.workdir)}
    shown = {src for _, src in binds(bwrap)}
    assert str(tmp_path / "state") not in shown
    assert str(tmp_path / "state" / "runs") not in shown
    assert str(tmp_path / "state" / "runs" / "r-1") not in shown
    assert not any(src.startswith(str(Path.home())) for src in rw)
    assert "/usr/lib/node" not in shown, "under /usr, already bound read-only"
    # The root is read-only once everything is bound.
    assert bwrap.index("--remount-ro") > max(i for i, a in enumerate(bwrap) if a == "--bind")


def test_network_host_shares_the_host_s_network(tmp_path: Path) -> None:
    bwrap = confinement(tmp_path, NetworkKind.HOST).bwrap_argv(["pi"])
    assert "--unshare-net" not in bwrap
    assert "--unshare-pid" in bwrap


def test_the_forwarder_puts_the_key_in_the_api_s_header_alone() -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"host: tether-provider.invalid\r\nAuthorization: Bearer tether-no-key\r\n"
        b"x-stainless-lang: js\r\nConnection: keep-alive\r\ncontent-length: 2\r\n"
        b"Accept-Encoding: gzip, deflate\r\nTE: trailers"
    )
    api = _Api("openai-completions", "/v1")
    method, target, headers, length = _upstream_request(
        head, key=b"sk-real", placeholder=NO_KEY.encode(), api=api
    )
    assert (method, target, length) == ("POST", "/v1/chat/completions", 2)
    # What belongs to pi's connection stays behind; the forwarder sets Host and the length, the
    # key's header, and asks for an answer it can check for the key (not compressed).
    assert headers == [
        (b"x-stainless-lang", b"js"),
        (b"Authorization", b"Bearer sk-real"),
        (b"Accept-Encoding", b"identity"),
    ]
    # A keyless provider: the placeholder goes through as pi sent it.
    _, _, keyless, _ = _upstream_request(head, key=b"", placeholder=NO_KEY.encode(), api=api)
    assert (b"Authorization", b"Bearer tether-no-key") in keyless


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /v1 HTTP/1.1\r\ntransfer-encoding: chunked", "411 Length Required"),
        (b"POST /v1 HTTP/1.1\r\ncontent-length: ten", "400 Bad Request"),
        (b"POST /v1 HTTP/1.1\r\nno colon here", "400 Bad Request"),
        (b"GARBAGE", "400 Bad Request"),
    ],
)
def test_the_forwarder_refuses_what_it_cannot_pass_on(head: bytes, status: str) -> None:
    with pytest.raises(_Refusal) as refused:
        _upstream_request(head, key=b"k", placeholder=b"p", api=_Api("openai-completions", ""))
    assert refused.value.status == status


def test_upstream_addresses() -> None:
    assert split_base_url("http://127.0.0.1:18080/v1") == ("http://127.0.0.1:18080", "/v1")
    assert split_base_url("https://api.example.com/") == ("https://api.example.com", "")
    assert _parse_upstream("https://api.example.com") == ("https", "api.example.com", 443)
    assert _parse_upstream("http://127.0.0.1:18080") == ("http", "127.0.0.1", 18080)
    assert _parse_upstream("http://[::1]:8080") == ("http", "::1", 8080)
    with pytest.raises(ConfigError):
        split_base_url("127.0.0.1:8080/v1")


def test_a_sandboxed_agent_dir_names_the_relay_placeholder_and_no_key(tmp_path: Path) -> None:
    cfg = parse_config(
        """
[providers.hosted]
base_url = "https://api.example.com/v1"
[agents.rev]
provider = "hosted"
model = "m"
""",
        tmp_path / "tether.toml",
    )
    made = write_agent_dir(tmp_path / "agent", cfg, "rev", sandboxed=True)
    models = json.loads((made.path / "models.json").read_text())
    entry = models["providers"]["hosted"]
    assert entry["baseUrl"] == PROVIDER_ORIGIN + "/v1"
    assert entry["apiKey"] == NO_KEY
    plain = write_agent_dir(tmp_path / "plain", cfg, "rev")
    assert (
        json.loads((plain.path / "models.json").read_text())["providers"]["hosted"]["baseUrl"]
        == "https://api.example.com/v1"
    )


def _result(text: str, tool: str = "bash", *, error: bool = True) -> dict[str, object]:
    content = [{"type": "text", "text": text}]
    return {"role": "toolResult", "toolName": tool, "content": content, "isError": error}


@pytest.mark.parametrize(
    ("text", "tool", "expected"),
    [
        # What pi's tools returned, run in the sandbox (tests/test_sandbox_limits.py).
        (
            "/bin/bash: line 1:    15 File size limit exceededhead -c 10G /dev/zero > big\n\n\n"
            "Command exited with code 153",
            "bash",
            [("file_size", "exit status 153 (SIGXFSZ)")],
        ),
        (
            "/bin/bash: line 1:    17 File size limit exceededhead -c 10G /dev/zero > big\nafter\n",
            "bash",
            [("file_size", "SIGXFSZ (File size limit exceeded)")],
        ),
        ("EFBIG: file too large, write", "edit", [("file_size", "EFBIG")]),
        (
            "OSError: [Errno 27] File too large\n\n\nCommand exited with code 1",
            "bash",
            [("file_size", "EFBIG (File too large)")],
        ),
        (
            'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
            "MemoryError\n\n\nCommand exited with code 1",
            "bash",
            [("memory", "MemoryError")],
        ),
        (
            "tail: memory exhausted\n\n\nCommand exited with code 1",
            "bash",
            [("memory", "memory exhausted")],
        ),
        (
            "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory",
            "bash",
            [("memory", "out of memory")],
        ),
        (
            "environment: fork: retry: Resource temporarily unavailable\n"
            "/bin/bash: fork: Resource temporarily unavailable\n\n\nCommand exited with code 254",
            "bash",
            [("processes", "EAGAIN (Resource temporarily unavailable)")],
        ),
        (
            "BlockingIOError: [Errno 11] Resource temporarily unavailable\n",
            "bash",
            [("processes", "EAGAIN (Resource temporarily unavailable)")],
        ),
        # Both, in one result.
        (
            "bash: fork: Cannot allocate memory\nhead: File too large\n",
            "bash",
            [
                ("memory", "ENOMEM (Cannot allocate memory)"),
                ("file_size", "EFBIG (File too large)"),
            ],
        ),
        # A failure that is no limit; a read tool showing a file that holds the words.
        (
            "ls: cannot access 'x': No such file or directory\n\nCommand exited with code 2",
            "bash",
            [],
        ),
        ("Command exited with code 152", "bash", []),
        ("except MemoryError:\n    raise\n# fork: Resource temporarily unavailable", "read", []),
        ("MemoryError", "recall", []),
    ],
)
def test_a_tool_result_names_the_limit_its_tool_hit(
    text: str, tool: str, expected: list[tuple[str, str]]
) -> None:
    found = limits_in(_result(text, tool))
    assert [(limit.value, evidence) for limit, evidence in found] == expected


def test_no_space_left_counts_only_in_the_sandbox_s_tmp() -> None:
    full = (
        "head: error writing 'standard output': No space left on device\n"
        "\nCommand exited with code 1"
    )
    assert limits_in(_result(full)) == []  # the workdir's disk: not a limit of the run
    assert limits_in(_result(full), call='{"command": "head -c 3M /dev/zero > /tmp/b"}') == [
        (SandboxLimit.FILE_SIZE, "ENOSPC in /tmp (No space left on device)")
    ]
    assert limits_in(_result(full), call='{"command": "cat /tmpfoo/x"}') == []


def test_the_watch_names_each_hit_once_by_seq_and_keeps_the_first_ten_of_a_limit() -> None:
    watch = LimitWatch()
    call = {
        "role": "assistant",
        "content": [
            {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "x > /tmp/a"}}
        ],
    }
    watch.see(3, call)
    no_space = _result("write error: No space left on device") | {"toolCallId": "c1"}
    watch.see(4, no_space)
    watch.see(4, no_space)  # the mirror wrote it again after a failed pass
    watch.see(5, {"role": "user", "content": "MemoryError"})
    for seq in range(10, 30):
        watch.see(seq, _result("MemoryError"))
    assert watch.hits[0] == LimitHit(
        limit=SandboxLimit.FILE_SIZE,
        tool="bash",
        seq=4,
        evidence="ENOSPC in /tmp (No space left on device)",
    )
    assert [h.seq for h in watch.hits[1:]] == list(range(10, 10 + MAX_PER_LIMIT))
    extra = {"limits_hit": msgspec.to_builtins(watch.hits[:3])}
    assert [h.seq for h in recorded_limits(extra)] == [4, 10, 11]
    assert (
        limits_text(extra) == "memory (bash at seq 10, bash at seq 11); file_size (bash at seq 4)"
    )
    assert limits_text({}) is None
    assert recorded_limits({"limits_hit": [{"limit": "cpu", "tool": "bash", "seq": 1}]}) == []
