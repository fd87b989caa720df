"""A real Matrix homeserver for the bridge's tests: Synapse from ``.venv-synapse`` (``make
synapse``, from the hash-pinned requirements/synapse.txt; never a dependency of tether), on a
free 127.0.0.1 port with SQLite in a temporary directory.

    hs = Homeserver.start(tmp)          # or the session-scoped ``homeserver`` fixture
    ana = hs.register("ana")            # a logged-in user: .user_id, .token, .send(...)
    hs.stop()

Rate limits are relaxed for everyone; :meth:`Homeserver.limit` gives one user a low message
limit again (Synapse's admin API), so a test sees ``M_LIMIT_EXCEEDED``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

__all__ = ["SYNAPSE_PY", "Homeserver", "MatrixUser", "People", "homeserver", "people"]

ROOT = Path(__file__).resolve().parents[2]
SYNAPSE_PY = Path(os.environ.get("TETHER_TEST_SYNAPSE_PYTHON", ROOT / ".venv-synapse/bin/python"))
SERVER_NAME = "localhost"
_txns = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp: Path, port: int, secret: str) -> str:
    relaxed = "{per_second: 1000, burst_count: 1000}"
    return f"""
server_name: "{SERVER_NAME}"
pid_file: "{tmp}/homeserver.pid"
listeners:
  - port: {port}
    tls: false
    type: http
    x_forwarded: false
    bind_addresses: ["127.0.0.1"]
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{tmp}/homeserver.db"
log_config: "{tmp}/log.yaml"
media_store_path: "{tmp}/media"
signing_key_path: "{tmp}/signing.key"
registration_shared_secret: "{secret}"
macaroon_secret_key: "{secrets.token_hex(16)}"
form_secret: "{secrets.token_hex(16)}"
report_stats: false
enable_registration: false
trusted_key_servers: []
suppress_key_server_warning: true
url_preview_enabled: false
enable_metrics: false
presence:
  enabled: false
rc_message: {relaxed}
rc_registration: {relaxed}
rc_joins:
  local: {relaxed}
  remote: {relaxed}
rc_invites:
  per_room: {relaxed}
  per_user: {relaxed}
rc_login:
  address: {relaxed}
  account: {relaxed}
  failed_attempts: {relaxed}
rc_admin_redaction: {relaxed}
rc_room_creation: {relaxed}
rc_media_create: {relaxed}
caches:
  sync_response_cache_duration: 0  # a test's sync sees what happened since its last one
"""


_LOG = """
version: 1
formatters:
  plain: {format: "%(asctime)s %(levelname)s %(name)s: %(message)s"}
handlers:
  file: {class: logging.FileHandler, filename: "LOGFILE", formatter: plain}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
"""


@dataclass
class MatrixUser:
    """A user logged in on the homeserver, with a small client of its own (plain HTTP)."""

    hs: Homeserver
    user_id: str
    token: str

    def _call(self, method: str, path: str, body: Any = None, **params: Any) -> dict[str, Any]:
        r = self.hs.client.request(
            method,
            f"/_matrix/client/v3{path}",
            json=body,
            params=params or None,
            headers={"Authorization": f"Bearer {self.token}"},
        )
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
        out: dict[str, Any] = r.json()
        return out

    def create_room(self, *, invite: list[str] = (), encrypted: bool = False) -> str:  # type: ignore[assignment]
        body: dict[str, Any] = {"preset": "private_chat", "invite": list(invite)}
        if encrypted:
            body["initial_state"] = [
                {
                    "type": "m.room.encryption",
                    "state_key": "",
                    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
                }
            ]
        return str(self._call("POST", "/createRoom", body)["room_id"])

    def join(self, room: str) -> None:
        self._call("POST", f"/join/{urllib.parse.quote(room)}", {})

    def send(
        self,
        room: str,
        text: str,
        *,
        thread: str | None = None,
        mention: MatrixUser | None = None,
        txn: str | None = None,
    ) -> str:
        """Post ``text`` (in ``thread``; mentioning ``mention`` as clients do); its event id."""
        content: dict[str, Any] = {"msgtype": "m.text", "body": text}
        if mention is not None:
            content["body"] = f"{mention.user_id}: {text}"
            content["m.mentions"] = {"user_ids": [mention.user_id]}
        if thread is not None:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": thread,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": thread},
            }
        txn = txn or f"t{time.time_ns()}-{next(_txns)}"
        room_q = urllib.parse.quote(room)
        return str(
            self._call("PUT", f"/rooms/{room_q}/send/m.room.message/{txn}", content)["event_id"]
        )

    def redact(self, room: str, event: str, reason: str = "taken back") -> str:
        """Take ``event`` back (a redaction); the redaction's event id."""
        txn = f"r{time.time_ns()}-{next(_txns)}"
        path = f"/rooms/{urllib.parse.quote(room)}/redact/{urllib.parse.quote(event)}/{txn}"
        return str(self._call("PUT", path, {"reason": reason})["event_id"])

    def upload(self, data: bytes, mime_type: str, name: str) -> str:
        """Upload ``data``; its ``mxc://`` URI."""
        got = self.hs.client.post(
            "/_matrix/media/v3/upload",
            params={"filename": name},
            content=data,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": mime_type},
        )
        assert got.status_code == 200, got.text
        return str(got.json()["content_uri"])

    def send_image(
        self, room: str, data: bytes, mime_type: str, *, mention: MatrixUser | None = None
    ) -> str:
        """Post an image (``m.image``, uploaded first); its event id."""
        content: dict[str, Any] = {
            "msgtype": "m.image",
            "body": "picture.png",
            "url": self.upload(data, mime_type, "picture.png"),
            "info": {"mimetype": mime_type, "size": len(data)},
        }
        if mention is not None:
            content["m.mentions"] = {"user_ids": [mention.user_id]}
        room_q = urllib.parse.quote(room)
        txn = f"i{time.time_ns()}-{next(_txns)}"
        sent = self._call("PUT", f"/rooms/{room_q}/send/m.room.message/{txn}", content)
        return str(sent["event_id"])

    def typing_in(self, room: str) -> list[str]:
        """Who is typing in ``room`` now (an initial sync's ``m.typing``)."""
        got = self._call("GET", "/sync", timeout=0)
        joined = got.get("rooms", {}).get("join", {}).get(room, {})
        for event in joined.get("ephemeral", {}).get("events", []):
            if event.get("type") == "m.typing":
                return list(event["content"].get("user_ids", []))
        return []

    def thread(self, room: str, root: str) -> list[dict[str, Any]]:
        """The events in thread ``root``, oldest first."""
        room_q = urllib.parse.quote(room)
        got = self.hs.client.get(
            f"/_matrix/client/v1/rooms/{room_q}/relations/{urllib.parse.quote(root)}/m.thread",
            params={"limit": 100, "dir": "f"},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        assert got.status_code == 200, got.text
        return list(got.json()["chunk"])

    def messages(self, room: str) -> list[dict[str, Any]]:
        """The room's message events, oldest first."""
        room_q = urllib.parse.quote(room)
        chunk = self._call("GET", f"/rooms/{room_q}/messages", dir="b", limit=200)["chunk"]
        return [e for e in reversed(chunk) if e.get("type") == "m.room.message"]


class Homeserver:
    def __init__(self, tmp: Path, port: int, proc: subprocess.Popen[bytes], secret: str) -> None:
        self.tmp = tmp
        self.port = port
        self.proc = proc
        self.secret = secret
        self.url = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(base_url=self.url, timeout=30)
        self.admin: MatrixUser | None = None
        self.config = tmp / "homeserver.yaml"

    @classmethod
    def start(cls, tmp: Path) -> Homeserver:
        if not SYNAPSE_PY.exists():
            pytest.fail(
                f"no Synapse at {SYNAPSE_PY}: `make synapse` installs it (requirements/synapse.txt)"
            )
        tmp.mkdir(parents=True, exist_ok=True)
        port, secret = _free_port(), secrets.token_hex(16)
        config = tmp / "homeserver.yaml"
        config.write_text(_config(tmp, port, secret))
        (tmp / "log.yaml").write_text(_LOG.replace("LOGFILE", str(tmp / "homeserver.log")))
        subprocess.run(
            [str(SYNAPSE_PY), "-m", "synapse.app.homeserver", "-c", str(config), "--generate-keys"],
            check=True,
            capture_output=True,
        )
        hs = cls(tmp, port, cls._spawn(tmp, config), secret)
        hs.wait_up()
        hs.admin = hs.register("admin", admin=True)
        return hs

    @staticmethod
    def _spawn(tmp: Path, config: Path) -> subprocess.Popen[bytes]:
        out = (tmp / "stdout.log").open("ab")
        return subprocess.Popen(
            [str(SYNAPSE_PY), "-m", "synapse.app.homeserver", "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_up(self, within: float = 60) -> None:
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(httpx.TransportError):
                if self.client.get("/_matrix/client/versions").status_code == 200:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.tmp / "stdout.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Synapse did not come up on {self.url}:\n{log}")
            time.sleep(0.1)

    def register(self, name: str, *, admin: bool = False) -> MatrixUser:
        """A new user (``register_new_matrix_user`` with the shared secret), logged in."""
        password = f"pw-{name}-{secrets.token_hex(4)}"
        subprocess.run(
            [
                str(SYNAPSE_PY.parent / "register_new_matrix_user"),
                "-u",
                name,
                "-p",
                password,
                "-a" if admin else "--no-admin",
                "-k",
                self.secret,
                self.url,
            ],
            check=True,
            capture_output=True,
        )
        got = self.client.post(
            "/_matrix/client/v3/login",
            json={
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": name},
                "password": password,
            },
        )
        assert got.status_code == 200, got.text
        body = got.json()
        return MatrixUser(self, body["user_id"], body["access_token"])

    def limit(self, user: MatrixUser, *, per_second: int, burst: int) -> None:
        """Give ``user`` its own message rate limit (the others stay relaxed)."""
        assert self.admin is not None
        got = self.client.post(
            f"/_synapse/admin/v1/users/{urllib.parse.quote(user.user_id)}/override_ratelimit",
            json={"messages_per_second": per_second, "burst_count": burst},
            headers={"Authorization": f"Bearer {self.admin.token}"},
        )
        assert got.status_code == 200, got.text

    def stop_process(self) -> None:
        """Stop the homeserver (its database kept): connections to it are refused."""
        self._end()

    def restart(self) -> None:
        """Start it again on the same port and database."""
        if self.proc.poll() is None:
            return
        self.proc = self._spawn(self.tmp, self.config)
        self.wait_up()

    def stop(self) -> None:
        self.client.close()
        self._end()

    def _end(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def bridge_toml(
    hs: Homeserver, bot: MatrixUser, rooms: list[str], *, token_env: str, settings: str = ""
) -> str:
    """The ``[bridges.matrix]`` section binding ``rooms`` to the agent ``rev`` (``settings``: more
    keys of the section, one ``key = value`` a line)."""
    bound = "\n".join(f'"{r}" = "rev"' for r in rooms)
    return (
        f'\n[bridges.matrix]\nhomeserver = "{hs.url}"\nuser = "{bot.user_id}"\n'
        f'token_env = "{token_env}"\n{settings}\n\n[bridges.matrix.rooms]\n{bound}\n'
    )


@pytest.fixture(scope="session")
def homeserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Homeserver]:
    """One Synapse for the session's Matrix tests (they run in one xdist group)."""
    hs = Homeserver.start(tmp_path_factory.mktemp("synapse"))
    try:
        yield hs
    finally:
        hs.stop()


@dataclass
class People:
    """The session's Matrix accounts: the bot the bridges log in as, and two people."""

    hs: Homeserver
    bot: MatrixUser
    ana: MatrixUser
    bob: MatrixUser


@pytest.fixture(scope="session")
def people(homeserver: Homeserver) -> People:
    return People(
        homeserver,
        homeserver.register("tether"),
        homeserver.register("ana"),
        homeserver.register("bob"),
    )
