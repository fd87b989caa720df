"""The service (docs/contracts.md#the-http-api): the HTTP API over the ledger, event streams, and
the workers that
claim queued runs and execute them as ``tether run`` does.

    from tether.service import Worker, create_app

    app = create_app(config, ledger, workers=2)     # serve it with uvicorn (`tether serve`)
    await Worker(ledger, config, concurrency=4).run()   # `tether worker`

Modules: ``app`` (create_app), ``api`` (the JSON API), ``stream`` (server-sent events),
``hub`` (live events of this process's runs, a bounded buffer per stream), ``ops`` (/healthz,
/metrics), ``auth`` (bearer tokens), ``pages`` (the pages for people, a package), ``worker``
(claiming and executing runs, relay), ``state`` and ``metrics``.
"""

from __future__ import annotations

from tether.service.app import create_app
from tether.service.auth import token_digest
from tether.service.worker import Worker

__all__ = ["Worker", "create_app", "token_digest"]
