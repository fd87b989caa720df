"""``tether token add|list|revoke``: the service's bearer tokens in ``[service.tokens]``.

The config keeps only each token's SHA-256 hex (``tether.service.auth``); ``add`` makes a token,
prints it once and writes its digest; ``list`` shows digests (a prefix) and actors; ``revoke``
removes lines. The file is edited as text, line by line, so its comments and layout stay; the
result is parsed again before it replaces the file (atomically), and nothing is written when it
would not load. A running ``tether serve`` reads its tokens at start: restart it after a change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from tether.cli.counts import counted
from tether.cli.exits import command, err_console
from tether.config import load_config, parse_config
from tether.errors import ConfigError, UsageError

__all__ = ["token_app"]

token_app = typer.Typer(
    name="token",
    help="The service's bearer tokens ([service.tokens]): add, list, revoke.",
    no_args_is_help=True,
)

_HEADER = re.compile(r"^\s*\[\s*service\s*\.\s*tokens\s*\]\s*(#.*)?$")
_TABLE = re.compile(r"^\s*\[")
_ENTRY = re.compile(r'^\s*"?([0-9a-f]{64})"?\s*=\s*"([^"]*)"\s*(#.*)?$')

ConfigPath = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="tether.toml to change (default: $TETHER_CONFIG or ./tether.toml)."
    ),
]


def _path(config: Path | None) -> Path:
    chosen = Path(config or os.environ.get("TETHER_CONFIG") or "tether.toml")
    if not chosen.exists():
        raise ConfigError(
            f"config file {chosen} does not exist: tokens are kept in its [service.tokens]"
        )
    return chosen


def _entries(lines: list[str]) -> tuple[int | None, list[tuple[int, str, str]]]:
    """The ``[service.tokens]`` header's line and the table's ``digest = "actor"`` lines."""
    header: int | None = None
    found: list[tuple[int, str, str]] = []
    for i, line in enumerate(lines):
        if _HEADER.match(line):
            header = i
            continue
        if header is not None and i > header:
            if _TABLE.match(line):
                break
            if m := _ENTRY.match(line):
                found.append((i, m.group(1), m.group(2)))
    return header, found


def _replace(path: Path, lines: list[str]) -> None:
    text = "".join(lines)
    parse_config(text, path)  # a change that would not load is never written
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tether-token-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@token_app.command("add")
@command
def add(
    actor: Annotated[str, typer.Option("--actor", help="Whom the token acts as, e.g. user:ana.")],
    config: ConfigPath = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"token","digest","actor"}.')
    ] = False,
) -> None:
    """Make a token for ACTOR, write its digest into [service.tokens] and print it once.

    Example: tether token add --actor user:ana
    """
    if not actor.strip() or any(c in actor for c in '"\\\n'):
        raise UsageError(f"--actor {actor!r}: give an actor such as user:ana")
    path = _path(config)
    token = secrets.token_urlsafe(32)
    # (as tether.service.auth.token_digest, without importing the service's extra)
    hashed = hashlib.sha256(token.encode("utf-8")).hexdigest()
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    header, _ = _entries(lines)
    entry = f'"{hashed}" = "{actor}"\n'
    if header is None:
        lines += ["\n", "[service.tokens]\n", entry]
    else:
        lines.insert(header + 1, entry)
    _replace(path, lines)
    if as_json:
        print(json.dumps({"token": token, "digest": hashed, "actor": actor}))
        return
    print(token)
    err_console.print(
        f"token for {actor} added to {path} (only its SHA-256 is kept: this is the one time it "
        "is shown); restart tether serve to use it",
        markup=False,
    )


@token_app.command("list")
@command
def list_tokens(
    config: ConfigPath = None,
    as_json: Annotated[bool, typer.Option("--json", help='Print [{"digest","actor"}].')] = False,
) -> None:
    """List the tokens' digests (their first 12 hex digits) and actors.

    Example: tether token list
    """
    cfg = load_config(_path(config))
    tokens = sorted(cfg.service.tokens.items(), key=lambda kv: (kv[1], kv[0]))
    if as_json:
        print(json.dumps([{"digest": d, "actor": a} for d, a in tokens]))
        return
    for hashed, actor in tokens:
        print(f"{hashed[:12]}  {actor}")
    err_console.print(counted(len(tokens), "token"), markup=False)


@token_app.command("revoke")
@command
def revoke(
    which: Annotated[
        str, typer.Argument(help="A digest (or a prefix of at least 8 hex digits), or an actor.")
    ],
    config: ConfigPath = None,
) -> None:
    """Remove tokens from [service.tokens]: by digest prefix, or every token of an actor.

    Example: tether token revoke user:ana
    """
    path = _path(config)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    _, entries = _entries(lines)
    by_digest = re.fullmatch(r"[0-9a-f]{8,64}", which) is not None
    gone = {
        i
        for i, hashed, actor in entries
        if (hashed.startswith(which) if by_digest else actor == which)
    }
    if not gone:
        raise UsageError(f"no token in {path} matches {which!r} (see tether token list)")
    _replace(path, [line for i, line in enumerate(lines) if i not in gone])
    err_console.print(
        f"revoked {counted(len(gone), 'token')} ({which}); restart tether serve to apply it",
        markup=False,
    )
