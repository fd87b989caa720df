"""Images posted with a request (``POST /v1/sessions/{session}/requests`` ``images``): checked
before anything is written (:mod:`tether.images`), then carried by the queued run.

Over a limit (``[followup] media_max_bytes`` for one, ``media_max_total_bytes`` for all) is 413;
malformed (not base64, bytes that are not the type named, a type not taken), an agent whose
model takes no images (``[agents.X] images``), or a request relayed into a live run
(``deliver`` other than ``queue``) is 422. Each answer says what is wrong and where.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from tether.config import Config
from tether.harness.relay import Deliver
from tether.images import IMAGES_KEY, ImageProblem, check_images, images_digest
from tether.ledger import Run

__all__ = ["ImageIn", "digests", "request_images"]

UNPROCESSABLE = 422
TOO_LARGE = 413


class ImageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    data: str = Field(min_length=1)
    """The image's bytes, base64 (standard alphabet, padded)."""
    mime_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"] = Field(
        alias="mimeType"
    )


def request_images(
    config: Config, agent: str, deliver: Deliver, images: list[ImageIn]
) -> dict[str, Any]:
    """What the queued run's record carries for ``images`` (``{}`` for none), or the 413/422
    saying why they are refused."""
    if not images:
        return {}
    found = config.agents.get(agent)
    if found is not None and not found.images:
        raise HTTPException(
            UNPROCESSABLE,
            f"agent {agent!r} takes no images (its model is text only here); send the request "
            f"without images, or ask the server's operator to set [agents.{agent}] images = true",
        )
    if deliver is not Deliver.QUEUE:
        raise HTTPException(
            UNPROCESSABLE,
            'images travel only with "deliver": "queue" (they become the request row of the '
            "session's next run); send them queued",
        )
    try:
        kept = check_images(
            [{"data": i.data, "mimeType": i.mime_type} for i in images],
            max_each=config.followup.media_max_bytes,
            max_total=config.followup.media_max_total_bytes,
        )
    except ImageProblem as exc:
        code = TOO_LARGE if exc.too_large else UNPROCESSABLE
        raise HTTPException(code, str(exc)) from None
    return {IMAGES_KEY: kept}


def digests(run: Run, images: list[ImageIn]) -> tuple[list[str], list[str]]:
    """What identifies the images a run was queued with, and the posted ones (a request
    repeated with its ``request_id`` must carry the same)."""
    posted = [
        {"mimeType": i.mime_type, "sha256": hashlib.sha256(i.data.encode()).hexdigest()}
        for i in images
    ]
    return images_digest(run.extra.get(IMAGES_KEY)), images_digest(posted)
