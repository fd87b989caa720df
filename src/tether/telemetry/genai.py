"""Values of OpenTelemetry's GenAI semantic conventions, from what tether and pi know: the
well-known ``gen_ai.provider.name`` of a provider's pi api, the ``gen_ai.response.finish_reasons``
of pi's stop reasons, and where a provider's endpoint is (``server.address``, ``server.port``).

The values are the published ones (PyPI ``opentelemetry-semantic-conventions``:
``GenAiProviderNameValues``; the finish reasons of the conventions' output messages), written out
here because this module runs when tracing is off, when nothing of OpenTelemetry is imported.
tests/test_telemetry_conventions.py checks them against the package.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = [
    "FINISH_REASONS",
    "PROVIDER_NAMES",
    "finish_reasons",
    "provider_name",
    "server_of",
]

PROVIDER_NAMES: dict[str, str] = {
    # pi's api (pi-ai's KnownApi) -> the conventions' well-known provider name.
    "openai-completions": "openai",
    "openai-responses": "openai",
    "openai-codex-responses": "openai",
    "azure-openai-responses": "azure.ai.openai",
    "anthropic-messages": "anthropic",
    # generativelanguage.googleapis.com (AI Studio): the conventions' `gcp.gemini`.
    "google-generative-ai": "gcp.gemini",
    # aiplatform.googleapis.com: `gcp.vertex_ai`.
    "google-vertex": "gcp.vertex_ai",
    "mistral-conversations": "mistral_ai",
    "bedrock-converse-stream": "aws.bedrock",
}
"""The conventions set ``gen_ai.provider.name`` from the instrumentation's best knowledge, which
may differ from who serves the model: it names the flavour of the API the client speaks. An
OpenAI-compatible server (llama.cpp, vLLM, a gateway) reached with ``openai-completions`` is
``openai``, and ``server.address`` says which server it was; ``[providers.X]
otel_provider_name`` names the real provider when it is known (``deepseek``, ``groq``, …)."""


def provider_name(api: str, override: str | None = None) -> str:
    """``gen_ai.provider.name`` of a provider that pi reaches with ``api``: ``override``
    (``[providers.X] otel_provider_name``) when given, else the well-known name of the api, else
    the api itself (one the conventions do not know: a custom value, as they allow)."""
    if override:
        return override
    return PROVIDER_NAMES.get(api, api)


FINISH_REASONS: dict[str, str] = {
    # pi's stop reason (pi-ai's StopReason) -> the conventions' finish reason.
    "stop": "stop",
    "length": "length",
    "toolUse": "tool_call",
    "error": "error",
    # The call was cut off by an abort (a stop, the deadline): it ended without an answer.
    "aborted": "error",
    # "pending" (a message still streaming) and "deferred" (an answer fetched later) did not
    # finish: no reason is given for them.
}

CONTENT_FILTERED = frozenset(
    {
        # The provider's own reason (pi's rawStopReason) when pi's stop reason is "error"
        # because a filter stopped the answer, as pi-ai's clients map them.
        "content_filter",  # openai-completions
        "incomplete.content_filter",  # openai-responses: status.incomplete_details.reason
        "refusal",  # anthropic-messages
        "sensitive",  # anthropic-messages
        "SAFETY",  # google-*
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "RECITATION",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "guardrail_intervened",  # bedrock-converse-stream
        "content_filtered",
    }
)


def finish_reasons(stop: object, raw: object = None) -> tuple[str, ...] | None:
    """``gen_ai.response.finish_reasons`` of an assistant message whose ``stopReason`` is
    ``stop`` and ``rawStopReason`` is ``raw`` (one generation: one reason), or None when pi's
    reason says the call did not finish."""
    if not isinstance(stop, str):
        return None
    if stop == "error" and raw in CONTENT_FILTERED:
        return ("content_filter",)
    found = FINISH_REASONS.get(stop)
    return (found,) if found is not None else None


def server_of(base_url: str) -> tuple[str | None, int | None]:
    """``server.address`` and ``server.port`` of a provider's base URL (the port its scheme
    implies when the URL names none); ``(None, None)`` when the URL names no host. Only the host
    and port: never the URL's user, password, path or query."""
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None, None
    if not host:
        return None, None
    if port is None:
        port = {"https": 443, "http": 80}.get(parts.scheme.lower())
    return host, port
