"""`dlrt serve`: load the model and serve it over HTTP (uvicorn). Under torchrun `LLM(...)` returns
only on rank 0, which serves; the other ranks run its requests with it."""

from __future__ import annotations

import logging
import socket

from dlrt.errors import OptionError, PromptError
from dlrt.server.worker import Worker

log = logging.getLogger("dlrt.server")


def check_defaults(llm, defaults: dict) -> None:
    """Refuse bad decoding flags at startup, as `LLM.generate` would refuse them (the options
    resolved against the model's defaults), and a default max_new_tokens (the flag's or the
    model's) that does not fit the context even after a one-token prompt, so that every request
    leaving it unset would be refused; the message names the flag.

    Raises:
        OptionError: "--max-new-tokens: max_new_tokens=0 must be >= 1", "--max-new-tokens:
            max_new_tokens=5000 does not fit the context even for a one-token prompt: ...".
    """
    from dlrt.decoding.options import DecodingOptions, as_flag_error

    try:
        params = llm.resolve(DecodingOptions.from_kwargs(defaults))
        llm.check([0], **defaults)  # the context check of every request, at its smallest
    except OptionError as e:
        raise as_flag_error(e) from e
    except PromptError as e:
        fit = llm.max_new_tokens_fit(1, **defaults)
        if fit >= 1:
            given = "" if "max_new_tokens" in defaults else "the default "
            raise OptionError(
                f"--max-new-tokens: {given}max_new_tokens={params.max_new_tokens} does not fit "
                f"the context even for a one-token prompt: {e}; set --max-new-tokens {fit} or "
                "less") from e
        flag = "--block-length" if "block_length" in defaults else "--max-model-len"
        raise OptionError(f"{flag}: not even one new token fits the context after a one-token "
                          f"prompt: {e}") from e


def check_address(host: str, port: int) -> None:
    """Refuse a host that does not resolve to an address (before uvicorn, whose error does
    not name it) and a port outside 0..65535.

    Raises:
        OptionError: "--host: cannot resolve '999.1.1.1' to an address to listen on (...)".
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionError(f"--port: {port!r} is not a port number in [0, 65535]")
    try:  # "" listens on every interface, as socket.bind takes it (AI_PASSIVE with None)
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                           flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as e:
        raise OptionError(f"--host: cannot resolve {host!r} to an address to listen on "
                          f"({e})") from e


def check_server_packages() -> None:
    """OptionError naming the install command when FastAPI or uvicorn is missing (the
    `serve` extras)."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise OptionError(f"dlrt serve needs {' and '.join(missing)}: install the server "
                          "extras, pip install 'dlrt[serve]' (from a checkout: "
                          "pip install -e '.[serve]')")


def served_name(model) -> str:
    """The name a model is served under by default: the last part of its path (its folder's
    name; `name` of a hub repo id `org/name`), or "dlrt-default" for the embedded default."""
    return str(model).rstrip("/").split("/")[-1] if model else "dlrt-default"


def serve(llm_kwargs: dict, defaults: dict, host: str, port: int, max_queue: int,
          request_timeout: float, max_body_bytes: int, served_model_name: str | None = None,
          api_key: str | None = None) -> int:
    """Load `LLM(**llm_kwargs)` and serve it (blocks until shutdown) as `served_model_name`
    (default: `served_name`), asking for `api_key` when set. Under torchrun the model loads on
    every rank and only rank 0 gets here past the load (`LLM`). Returns the process exit code
    (3: the server could not start).

    Raises:
        OptionError: a host that does not resolve or a port out of range (before the model
            loads), decoding defaults no request could use (`check_defaults`).
    """
    from dlrt import LLM

    check_server_packages()  # before the model loads
    check_address(host, port)  # on every rank, before the model loads: all of them stop
    llm = LLM(**llm_kwargs)
    model = llm_kwargs.get("model")
    check_defaults(llm, defaults)
    import uvicorn

    from dlrt.server.app import create_app

    name = served_model_name or served_name(model)
    worker = Worker(llm, max_queue=max_queue, timeout_s=request_timeout)
    app = create_app(llm, worker, name, defaults, max_body_bytes, api_key=api_key)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)  # a failed bind logs the error and exits
            if self.started:
                log.info("serving %s on http://%s:%d (%d rank(s)%s)", name, host, port,
                         llm.world_size, ", API key required" if api_key else "")

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run()  # as uvicorn.run does
    except KeyboardInterrupt:
        pass
    finally:
        llm.close()  # under torchrun: the other ranks close with it and end
    return 0 if server.started else 3  # uvicorn's STARTUP_FAILURE
