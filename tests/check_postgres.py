"""Fail early, with a way out, when the test PostgreSQL is unreachable (never a silent skip)."""

from __future__ import annotations

import os
import sys

URL = os.environ.get("TETHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

try:
    import psycopg

    with psycopg.connect(URL, connect_timeout=5) as conn:
        conn.execute("SELECT 1")
except Exception as exc:  # any failure means the same thing to the person reading this
    sys.stderr.write(
        f"PostgreSQL at TETHER_TEST_POSTGRES_URL={URL} is unreachable: {exc}\n"
        "Start one (on Debian: pg_ctlcluster --skip-systemctl-redirect "
        "$(ls /etc/postgresql) main start), or point TETHER_TEST_POSTGRES_URL at a server "
        "where the user may create schemas.\n"
    )
    sys.exit(1)
print(f"PostgreSQL reachable at {URL}")
