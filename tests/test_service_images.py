"""Images posted with a request, over real HTTP against `tether serve` with the real pi and the
scripted provider: they reach pi's request to the model (an OpenAI-compatible ``image_url`` data
URL) and the request row (image parts after the text); over a limit, malformed, for a text-only
agent or relayed, they are refused with a message and nothing is written."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from provider import Reply, ScriptedProvider
from service_support import serve, write_config
from tether.ledger import open_ledger

Provider = Callable[..., ScriptedProvider]


def png(width: int = 2, height: int = 2) -> bytes:
    """A real PNG (red pixels): pi may decode what it is given."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _config(tmp: Path, provider_url: str, *, images: bool = True, followup: str = "") -> Path:
    path = write_config(tmp, provider_url)
    text = path.read_text()
    if images:
        text = text.replace("deadline_s = 60\n", "deadline_s = 60\nimages = true\n", 1)
    if followup:
        text = f"[followup]\n{followup}\n" + text
    path.write_text(text)
    return path


def _image_urls(body: dict[str, Any]) -> list[str]:
    out = []
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            out += [p["image_url"]["url"] for p in content if p.get("type") == "image_url"]
    return out


def test_an_image_posted_with_a_request_reaches_pis_request_to_the_model(
    tmp_path: Path, scripted_provider: Provider
) -> None:
    p = scripted_provider([Reply("a red square")])
    picture = b64(png())
    with serve(tmp_path, _config(tmp_path, p.url)) as s:

        def ask(data: str) -> httpx.Response:
            # the same question, the same request_id, with the image ``data``
            image = {"data": data, "mimeType": "image/png"}
            return s.post("s1", "what is in this picture?", request_id="k1", images=[image])

        posted = ask(picture)
        assert posted.status_code == 202, posted.text
        run = s.wait_run(posted.json()["run"])
        assert run["status"] == "finished", run
        assert run["answer"] == "a red square"
        # the request row: the text, then the image, as pi stores a prompt's images
        rows = s.get("/v1/sessions/s1/rows", after=0).json()["rows"]
        content = rows[0]["message"]["content"]
        assert content == [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image", "data": picture, "mimeType": "image/png"},
        ]
        # the same request_id with another image is a conflict, not the same request
        again = ask(b64(png(3, 3)))
        assert again.status_code == 409, again.text
        assert "images" in again.json()["detail"]["detail"]
        same = ask(picture)
        assert same.status_code == 202, same.text
        assert same.json()["run"] == run["run"]
    (task,) = p.task_requests
    urls = _image_urls(task.body)
    assert len(urls) == 1, task.body
    assert urls[0].startswith("data:image/png;base64,"), urls[0][:80]
    # the ended run's record keeps what identifies its images, not their data
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        kept = ledger.get_run(run["run"]).extra["images"]
    assert [set(i) for i in kept] == [{"mimeType", "bytes", "sha256"}]


def test_images_over_a_limit_malformed_or_not_taken_are_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    config = _config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        followup="media_max_bytes = 4000\nmedia_max_total_bytes = 6000",
    )
    small = b64(png())
    big = b64(png() + b"\x00" * 3500)
    jpeg_as_png = b64(b"\xff\xd8\xff\xe0" + b"\x00" * 40)
    cases: list[tuple[list[dict[str, Any]], int, str]] = [
        ([{"data": big, "mimeType": "image/png"}], 413, "media_max_bytes"),
        (
            [{"data": b64(png() + b"\x00" * 2500), "mimeType": "image/png"}] * 2,
            413,
            "media_max_total_bytes",
        ),
        ([{"data": "not base64!!", "mimeType": "image/png"}], 422, "not base64"),
        ([{"data": small[:-2], "mimeType": "image/png"}], 422, "not base64"),
        ([{"data": jpeg_as_png, "mimeType": "image/png"}], 422, "is not image/png"),
        (
            [{"data": small, "mimeType": "image/png"}, {"data": small, "mimeType": "image/webp"}],
            422,
            "images[1].data is not image/webp",
        ),
        ([{"data": small, "mimeType": "image/tiff"}], 422, "mimeType"),
        ([{"data": small}], 422, "mimeType"),
        ([{"data": small, "mimeType": "image/png", "url": "x"}], 422, "url"),
    ]
    with serve(tmp_path, config, workers=0) as s:
        for images, code, said in cases:
            got = s.post("s1", "look", images=images)
            assert got.status_code == code, (images[0].get("mimeType"), got.text)
            assert said in got.text, got.text
        relayed = s.post(
            "s1", "look", deliver="steer", images=[{"data": small, "mimeType": "image/png"}]
        )
        assert relayed.status_code == 422, relayed.text
        assert "queue" in relayed.text
        assert s.get("/v1/sessions").json()["sessions"] == []
    with open_ledger(f"sqlite://{tmp_path}/ledger.db") as ledger:
        assert ledger.sessions() == []
    # an agent whose model takes no images
    text_only = _config(tmp_path, "http://127.0.0.1:9/v1", images=False)
    with serve(tmp_path, text_only, workers=0) as s:
        got = s.post("s2", "look", images=[{"data": small, "mimeType": "image/png"}])
        assert got.status_code == 422, got.text
        assert "images = true" in got.text
        assert s.get("/v1/sessions").json()["sessions"] == []
