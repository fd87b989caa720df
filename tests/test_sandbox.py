"""The sandbox's pieces on their own (DESIGN §3.12): what bubblewrap is told to show, the
forwarder's rewrite of pi's request head, and pi's provider URL when sandboxed. The escapes
themselves, through the real pi, are in test_sandbox_escapes.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.config import LimitsConfig, NetworkKind, parse_config
from tether.errors import ConfigError
from tether.pi.agentdir import NO_KEY, write_agent_dir
from tether.sandbox.bwrap import PROVIDER_ORIGIN, Confinement, split_base_url
from tether.sandbox.outside import _parse_upstream, _rewrite_head


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


def test_the_forwarder_puts_the_key_where_pi_put_the_placeholder() -> None:
    head = (
        b"POST /v1/chat/completions?key=tether-no-key HTTP/1.1\r\n"
        b"host: 127.0.0.1:41000\r\nAuthorization: Bearer tether-no-key\r\n"
        b"x-api-key: tether-no-key\r\nConnection: keep-alive\r\ncontent-length: 2"
    )
    out = _rewrite_head(head, key=b"sk-real", placeholder=NO_KEY.encode(), host=b"api.example:443")
    lines = out.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions?key=sk-real HTTP/1.1"
    assert b"Authorization: Bearer sk-real" in lines
    assert b"x-api-key: sk-real" in lines
    assert b"content-length: 2" in lines
    assert [ln for ln in lines if ln.lower().startswith(b"host:")] == [b"Host: api.example:443"]
    assert [ln for ln in lines if ln.lower().startswith(b"connection:")] == [b"Connection: close"]
    assert out.endswith(b"\r\n\r\n")
    assert NO_KEY.encode() not in out
    # A keyless provider: the placeholder goes through as pi sent it.
    keyless = _rewrite_head(head, key=b"", placeholder=NO_KEY.encode(), host=b"h")
    assert b"Authorization: Bearer tether-no-key" in keyless


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
