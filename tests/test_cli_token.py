"""`tether token add|list|revoke`: a token made, shown once, kept as its digest in
[service.tokens] (the config's comments and layout kept), accepted by `tether serve`, listed,
and revoked (then refused)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx

from service_support import serve, write_config

TETHER = [sys.executable, "-m", "tether"]


def token(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TETHER, "token", *args, "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )


def test_a_token_is_added_listed_used_and_revoked(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg.write_text("# kept: a comment of the operator's\n" + cfg.read_text())
    added = token(cfg, "add", "--actor", "user:dana", "--json")
    assert added.returncode == 0, added.stderr
    made = json.loads(added.stdout)
    assert made["digest"] == hashlib.sha256(made["token"].encode()).hexdigest()
    text = cfg.read_text()
    assert made["token"] not in text
    assert f'"{made["digest"]}" = "user:dana"' in text
    assert text.startswith("# kept: a comment of the operator's\n")
    listed = token(cfg, "list", "--json")
    assert {"digest": made["digest"], "actor": "user:dana"} in json.loads(listed.stdout)
    plain = token(cfg, "list")
    assert f"{made['digest'][:12]}  user:dana" in plain.stdout
    assert "4 tokens" in plain.stderr

    def status(served_url: str) -> int:
        got = httpx.get(
            served_url + "/v1/sessions",
            headers={"Authorization": f"Bearer {made['token']}"},
            timeout=30,
        )
        return got.status_code

    with serve(tmp_path, cfg, workers=0) as served:
        assert status(served.url) == 200
    revoked = token(cfg, "revoke", "user:dana")
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked 1 token" in revoked.stderr
    assert made["digest"] not in cfg.read_text()
    with serve(tmp_path, cfg, workers=0) as served:
        assert status(served.url) == 401
    again = token(cfg, "revoke", made["digest"][:10])
    assert again.returncode == 2
    assert "no token" in again.stderr


def test_a_config_without_the_table_gets_one(tmp_path: Path) -> None:
    cfg = tmp_path / "tether.toml"
    cfg.write_text('[ledger]\nurl = "sqlite:ledger.db"')  # (no final newline)
    added = token(cfg, "add", "--actor", "user:ana")
    assert added.returncode == 0, added.stderr
    assert len(added.stdout.strip()) >= 40
    assert cfg.read_text().startswith('[ledger]\nurl = "sqlite:ledger.db"\n\n[service.tokens]\n')
    bad = token(cfg, "add", "--actor", 'x"y')
    assert bad.returncode == 2
