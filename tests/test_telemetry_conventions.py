"""tether's spans against OpenTelemetry's published semantic conventions (PyPI
``opentelemetry-semantic-conventions``, whose constants are imported here, never spelled out): the
``gen_ai.provider.name`` of each of pi's provider apis, the finish reasons of pi's stop reasons,
and the service's HTTP server span (its status code, and an error only for a 5xx). The spans of
real runs, exported over OTLP, are checked in tests/test_telemetry_otlp.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_CONVERSATION_ID,
    GenAiProviderNameValues,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
)
from opentelemetry.trace import SpanKind, StatusCode

from support.service import service_config
from support.spans import spans
from tether.config import ProviderConfig, load_config
from tether.errors import LedgerError
from tether.ledger import open_ledger
from tether.service import api
from tether.service.app import create_app
from tether.telemetry import genai

__all__ = ["spans"]  # the fixture (support.spans)

ROOT = Path(__file__).resolve().parent.parent
PI_TYPES = ROOT / "node_modules" / "@earendil-works" / "pi-ai" / "dist" / "types.d.ts"

WELL_KNOWN = {m.value for m in GenAiProviderNameValues}
FINISH_REASONS = {"stop", "length", "content_filter", "tool_call", "error"}
"""The conventions' finish reasons (``FinishReason`` of their output messages' JSON schema,
``gen-ai-output-messages.json``): the semantic-conventions package has no constants for them."""


def pi_union(name: str) -> set[str]:
    """The string literals of pi-ai's exported union type ``name`` (its declarations)."""
    found = re.search(rf"export type {name} = ([^;]+);", PI_TYPES.read_text())
    assert found, f"{name} is not declared in {PI_TYPES}"
    return set(re.findall(r'"([^"]+)"', found[1]))


# -- gen_ai.provider.name -------------------------------------------------------------------------


def test_each_api_names_its_provider_by_the_conventions_well_known_value() -> None:
    P = GenAiProviderNameValues
    assert {api: genai.provider_name(api) for api in genai.PROVIDER_NAMES} == {
        "openai-completions": P.OPENAI.value,
        "openai-responses": P.OPENAI.value,
        "openai-codex-responses": P.OPENAI.value,
        "azure-openai-responses": P.AZURE_AI_OPENAI.value,
        "anthropic-messages": P.ANTHROPIC.value,
        "google-generative-ai": P.GCP_GEMINI.value,
        "google-vertex": P.GCP_VERTEX_AI.value,
        "mistral-conversations": P.MISTRAL_AI.value,
        "bedrock-converse-stream": P.AWS_BEDROCK.value,
    }
    assert set(genai.PROVIDER_NAMES.values()) <= WELL_KNOWN
    # The configured name wins (an endpoint that speaks another provider's API)…
    assert genai.provider_name("openai-completions", P.GROQ.value) == P.GROQ.value
    # …and an api the conventions know no provider of is named as itself, never by a section.
    assert genai.provider_name("pi-messages") == "pi-messages"


@pytest.mark.pi  # reads pi's own declarations in node_modules
def test_every_api_pi_knows_is_mapped() -> None:
    # pi's own service api has no provider in the conventions: it keeps its name.
    assert pi_union("KnownApi") - set(genai.PROVIDER_NAMES) == {"pi-messages"}


def test_otel_provider_name_is_a_provider_s_key_and_names_it_on_spans() -> None:
    base = {"base_url": "https://api.groq.com/openai/v1"}
    cfg = ProviderConfig.model_validate({**base, "otel_provider_name": "groq"})
    assert (
        genai.provider_name(cfg.api, cfg.otel_provider_name) == GenAiProviderNameValues.GROQ.value
    )
    assert ProviderConfig.model_validate(base).otel_provider_name is None
    for bad in ("", "two words", "x" * 65):
        with pytest.raises(msgspec.ValidationError):
            ProviderConfig.model_validate({**base, "otel_provider_name": bad})


def test_server_address_and_port_of_a_base_url() -> None:
    assert genai.server_of("http://127.0.0.1:18080/v1") == ("127.0.0.1", 18080)
    assert genai.server_of("https://user:secret@api.example.com/v1?k=1") == ("api.example.com", 443)
    assert genai.server_of("http://[::1]/v1") == ("::1", 80)
    assert genai.server_of("not a url") == (None, None)


# -- gen_ai.response.finish_reasons ---------------------------------------------------------------


def test_pi_s_stop_reasons_become_the_conventions_finish_reasons() -> None:
    got = {stop: genai.finish_reasons(stop) for stop in genai.FINISH_REASONS}
    assert got == {
        "stop": ("stop",),
        "length": ("length",),
        "toolUse": ("tool_call",),
        "error": ("error",),
        "aborted": ("error",),
    }
    # A provider's filter: pi says "error", its raw reason says why.
    for raw in ("content_filter", "refusal", "SAFETY", "guardrail_intervened"):
        assert genai.finish_reasons("error", raw) == ("content_filter",)
    assert genai.finish_reasons("error", "network_error") == ("error",)
    assert genai.finish_reasons("stop", "content_filter") == ("stop",)
    # Not finished, or not a reason at all: none is given.
    assert [genai.finish_reasons(s) for s in ("pending", "deferred", None, 3)] == [None] * 4


@pytest.mark.pi  # reads pi's own declarations in node_modules
def test_every_stop_reason_pi_declares_is_mapped() -> None:
    declared = pi_union("StopReason")
    assert declared - set(genai.FINISH_REASONS) == {"pending", "deferred"}
    assert {r for stop in declared for r in genai.finish_reasons(stop) or ()} <= FINISH_REASONS
    assert {"content_filter"} == set(genai.finish_reasons("error", "content_filter") or ())


# -- the HTTP server span -------------------------------------------------------------------------


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_the_request_span_has_the_status_answered_and_is_an_error_only_for_a_5xx(
    tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = service_config(
        tmp_path, grants={"user:ana": ["repo:acme/*"]}, tokens={"ana-token": "user:ana"}
    )
    auth = {"Authorization": "Bearer ana-token"}
    route = "/v1/sessions/{session}/requests"

    def post(session: str, text: str, key: str) -> int:
        body = {"agent": "rev", "text": text, "request_id": key}
        return c.post(f"/v1/sessions/{session}/requests", json=body, headers=auth).status_code

    with (
        open_ledger(load_config(config).ledger.url) as ledger,
        TestClient(create_app(load_config(config), ledger), raise_server_exceptions=False) as c,
    ):
        assert post("s1", "hello", "k1") == 202
        assert post("s1", "another text", "k1") == 409  # the same request_id, another request

        async def ledger_down(*args: Any) -> Any:
            raise LedgerError("the database went away")

        monkeypatch.setattr(api, "_post_request", ledger_down)
        assert post("s2", "hello", "k2") == 503

        async def broken(*args: Any) -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setattr(api, "_post_request", broken)
        assert post("s3", "hello", "k3") == 500

    found = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert [s.name for s in found] == [f"POST {route}"] * 4
    for span in found:
        assert (attrs(span)[HTTP_REQUEST_METHOD], attrs(span)[HTTP_ROUTE]) == ("POST", route)
    assert [attrs(s)[GEN_AI_CONVERSATION_ID] for s in found] == ["s1", "s1", "s2", "s3"]
    got = [
        (attrs(s).get(HTTP_RESPONSE_STATUS_CODE), s.status.status_code, attrs(s).get(ERROR_TYPE))
        for s in found
    ]
    assert got == [
        (202, StatusCode.UNSET, None),
        (409, StatusCode.UNSET, None),  # the client's error, not the server's
        (503, StatusCode.ERROR, "503"),
        (500, StatusCode.ERROR, "RuntimeError"),
    ]
