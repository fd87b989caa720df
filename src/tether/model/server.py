"""The model server process: ``python -m tether.model.server --fd N`` (started by
:mod:`tether.model.process`, not by hand).

llama-cpp-python's OpenAI-compatible FastAPI app with the embedded GGUF and
:class:`~tether.model.middleware.CompatMiddleware` added to its middleware stack, served by
uvicorn on a socket the parent already bound and listens on (so the parent knows the port before
the model has loaded, and no other process can take it in between).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

from tether.model.middleware import CompatMiddleware
from tether.model.weights import DEFAULT_MODEL, find_model

__all__ = ["build_app", "main"]


def build_app(model_path: Path, *, alias: str, n_ctx: int, n_threads: int) -> Any:
    """llama-cpp-python's server app (FastAPI) for one model, with the compatibility middleware
    inside Starlette's error handling: a failure in it is a 500 answer, not a dropped socket."""
    # Imported here: the `local` extra is optional, and only this process needs it.
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    app = create_app(
        server_settings=ServerSettings(host="127.0.0.1", port=0),
        model_settings=[
            ModelSettings(
                model=str(model_path),
                model_alias=alias,
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                verbose=False,
            )
        ],
    )
    app.add_middleware(CompatMiddleware)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.model.server")
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket to serve on")
    parser.add_argument("--model", type=Path, default=None, help="GGUF file (default: embedded)")
    parser.add_argument("--alias", default=DEFAULT_MODEL.name)
    parser.add_argument("--ctx", type=int, default=DEFAULT_MODEL.context_window)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    import uvicorn

    sock = socket.socket(fileno=args.fd)
    app = build_app(
        args.model or find_model(), alias=args.alias, n_ctx=args.ctx, n_threads=args.threads
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    asyncio.run(server.serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
