"""`tether erase` on a terminal shows what it would erase and asks; `--yes` does not ask, and a
script (no terminal) goes ahead as before."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from tether.ledger import NewRow, RowKind, RunStatus, open_ledger


def _ledger(tmp: Path) -> str:
    url = f"sqlite://{tmp}/ledger.db"
    with open_ledger(url) as store:
        store.ensure_session("s1")
        fence = store.claim_run(store.create_run("s1", "rev").id)
        body = {"role": "user", "content": [{"type": "text", "text": "keep me?"}]}
        store.append(
            fence, [NewRow(actor="user:ana", kind=RowKind.MESSAGE, body=body)], request=True
        )
        store.end_run(fence, RunStatus.FINISHED)
    return url


def _sessions(url: str) -> list[str]:
    with open_ledger(url) as store:
        return [s.id for s in store.sessions()]


def _on_a_terminal(args: list[str], answer: str | None) -> tuple[int, str]:
    """``tether ARGS`` with a terminal for stdin, stdout and stderr; ``answer`` typed once it
    asks. Its exit status and all it showed."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", *args], stdin=child, stdout=child, stderr=child
    )
    os.close(child)
    shown = b""
    answered = answer is None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal closed: the program ended
                break
            if not chunk:
                break
            shown += chunk
        if not answered and b"cannot be undone" in shown:
            os.write(main, f"{answer}\n".encode())
            answered = True
        if proc.poll() is not None and not ready:
            break
    os.close(main)
    return proc.wait(timeout=30), shown.decode(errors="replace")


def test_on_a_terminal_erase_shows_the_plan_and_asks(tmp_path: Path) -> None:
    url = _ledger(tmp_path)
    code, shown = _on_a_terminal(["erase", "-s", "s1", "--ledger", url], "n")
    assert code == 0, shown
    assert "would erase session s1" in shown, shown
    assert "nothing erased" in shown, shown
    assert _sessions(url) == ["s1"]
    code, shown = _on_a_terminal(["erase", "-s", "s1", "--ledger", url], "y")
    assert code == 0, shown
    assert "erased session s1" in shown, shown
    assert _sessions(url) == []


def test_yes_and_scripts_erase_without_asking(tmp_path: Path) -> None:
    url = _ledger(tmp_path)
    code, shown = _on_a_terminal(["erase", "-s", "s1", "--yes", "--ledger", url], None)
    assert code == 0, shown
    assert "cannot be undone" not in shown, shown
    assert "erased session s1" in shown, shown
    assert _sessions(url) == []
    (tmp_path / "again").mkdir()
    url = _ledger(tmp_path / "again")
    piped = subprocess.run(
        [sys.executable, "-m", "tether", "erase", "-s", "s1", "--ledger", url],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert piped.returncode == 0, piped.stderr
    assert _sessions(url) == []
