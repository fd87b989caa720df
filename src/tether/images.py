"""Images attached to a request (``POST /v1/sessions/{session}/requests`` ``images``).

    images = check_images(body_images, config.followup)   # ImageProblem: what is wrong, where
    extra = {IMAGES_KEY: queued(images)}                  # the queued run carries them

An image is ``{"data": <base64>, "mimeType": "image/png"|"image/jpeg"|"image/gif"|"image/webp"}``:
the base64 must decode (standard alphabet, padded) and the bytes must begin as the type says
(magic numbers). The limits are the follow-up view's (``[followup] media_max_bytes`` for each,
``media_max_total_bytes`` for all of a request's together), so every image a request carries is
also one its next views can carry. Media never count against the text budget.

A queued run keeps its images in its record (``extra["images"]``: mime type, size, SHA-256 and
the data) until it ends; the run's end drops the data (:func:`ended_extra`) and keeps the rest,
so a retried ``request_id`` is still compared, while the request row holds the images for good
(user message content: the text, then ``{"type":"image","data","mimeType"}`` parts, as pi
stores a prompt's images).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "IMAGES_KEY",
    "MIME_TYPES",
    "ImageProblem",
    "check_images",
    "ended_extra",
    "image_parts",
    "images_digest",
]

IMAGES_KEY = "images"
"""Where a run's record keeps its request's images."""

MIME_TYPES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and "WEBP" at offset 8
}
"""The image types a request may carry, with the magic numbers their bytes begin with."""


class ImageProblem(ValueError):
    """An image a request may not carry: ``too_large`` (413) or malformed (422)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def _is(mime: str, raw: bytes) -> bool:
    if not any(raw.startswith(magic) for magic in MIME_TYPES[mime]):
        return False
    return mime != "image/webp" or raw[8:12] == b"WEBP"


def check_images(
    images: Sequence[Mapping[str, Any]], *, max_each: int, max_total: int
) -> list[dict[str, Any]]:
    """The request's images as its run keeps them (mime type, base64 size, SHA-256 of the data,
    the data), or :class:`ImageProblem` naming the first bad one (``images[i]``) and why."""
    out: list[dict[str, Any]] = []
    total = 0
    for i, image in enumerate(images):
        where = f"images[{i}]"
        mime = image.get("mimeType")
        data = image.get("data")
        if mime not in MIME_TYPES:
            raise ImageProblem(
                f"{where}.mimeType must be one of {', '.join(MIME_TYPES)}, not {mime!r}"
            )
        if not isinstance(data, str) or not data:
            raise ImageProblem(f"{where}.data must be the image's bytes in base64, not empty")
        size = len(data)
        if size > max_each:
            raise ImageProblem(
                f"{where} is {size} base64 bytes, over the {max_each}-byte limit of one "
                "attachment ([followup] media_max_bytes)",
                too_large=True,
            )
        total += size
        if total > max_total:
            raise ImageProblem(
                f"the images take {total} base64 bytes from images[0] to {where}, over the "
                f"{max_total}-byte limit of a view's attachments ([followup] "
                "media_max_total_bytes)",
                too_large=True,
            )
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ImageProblem(
                f"{where}.data is not base64 (the standard alphabet, padded, no line breaks)"
            ) from None
        if not _is(mime, raw):
            raise ImageProblem(
                f"{where}.data is not {mime}: its bytes do not begin as a {mime} file does"
            )
        out.append(
            {
                "mimeType": mime,
                "bytes": size,
                "sha256": hashlib.sha256(data.encode("ascii")).hexdigest(),
                "data": data,
            }
        )
    return out


def image_parts(images: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pi's ``ImageContent`` of each image that still has its data: the prompt's ``images``
    and the request row's content parts after the text."""
    return [
        {"type": "image", "data": i["data"], "mimeType": i["mimeType"]}
        for i in images
        if isinstance(i, Mapping) and isinstance(i.get("data"), str)
    ]


def images_digest(images: object) -> list[str]:
    """What identifies a request's images (their mime types and SHA-256s, in order): a retried
    ``request_id`` must carry the same."""
    if not isinstance(images, list):
        return []
    return [f"{i.get('mimeType')}:{i.get('sha256')}" for i in images if isinstance(i, Mapping)]


def ended_extra(extra: dict[str, Any]) -> dict[str, Any]:
    """A run's record as its end keeps it: its images without their data (the request row
    holds them), so later reads of the run do not carry megabytes."""
    images = extra.get(IMAGES_KEY)
    if not isinstance(images, list) or not any(isinstance(i, dict) and "data" in i for i in images):
        return extra
    kept = [
        {k: v for k, v in i.items() if k != "data"} if isinstance(i, dict) else i for i in images
    ]
    return {**extra, IMAGES_KEY: kept}
