"""Bearer tokens (docs/contracts.md#the-http-api): ``[service.tokens]`` maps the SHA-256 hex of a
token to an actor.

The actor of a request is always its token's, never a body field. Tokens are compared by their
digest only, so the configuration never holds a usable secret.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import HTTPException, Request, status

from tether.access import Admission
from tether.service.state import service_of

__all__ = ["Caller", "actor_for", "authenticate", "caller", "token_digest"]


def token_digest(token: str) -> str:
    """The SHA-256 hex of a token, as ``[service.tokens]`` keys it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def actor_for(tokens: Mapping[str, str], token: str) -> str | None:
    """The actor of ``token`` (None for an unknown one); digests compared in constant time."""
    digest = token_digest(token)
    found = None
    for known, actor in tokens.items():
        if hmac.compare_digest(known, digest):
            found = actor
    return found


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the token's actor and its admission decisions."""

    actor: str
    admission: Admission


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="tether"'}


def authenticate(tokens: Mapping[str, str], authorization: str) -> str:
    """The actor of an ``Authorization`` header's bearer token, or a 401 saying what to send.
    Checked before anything reads the request's body (:mod:`tether.service.guard`)."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "send Authorization: Bearer TOKEN (a token whose SHA-256 is in [service.tokens])",
            headers=_CHALLENGE,
        )
    actor = actor_for(tokens, token.strip())
    if actor is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "unknown token: its SHA-256 hex is not a key of [service.tokens]",
            headers=_CHALLENGE,
        )
    return actor


async def caller(request: Request) -> Caller:
    """The FastAPI dependency every endpoint but ``/healthz`` and ``/metrics`` takes: 401 without
    a valid ``Authorization: Bearer TOKEN``. Async (it only hashes): FastAPI would run a plain
    function in a worker thread, a hand-off per request."""
    state = service_of(request.app)
    actor = authenticate(state.config.service.tokens, request.headers.get("authorization", ""))
    return Caller(actor=actor, admission=Admission(state.config.access.grants, actor))
