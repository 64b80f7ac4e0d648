"""`dlrt serve`: load the model on every rank; rank 0 serves HTTP (uvicorn), the others follow."""

from __future__ import annotations

import logging

from dlrt.distributed.ranks import Ranks
from dlrt.errors import OptionError
from dlrt.server.worker import Worker, follow

log = logging.getLogger("dlrt.server")


def check_defaults(llm, defaults: dict) -> None:
    """Refuse bad decoding flags at startup, as `LLM.generate` would refuse them (the options
    resolved against the model's defaults); the message names the flag.

    Raises:
        OptionError: "--max-new-tokens: max_new_tokens=0 must be >= 1".
    """
    from dlrt.decoding.options import DecodingOptions, as_flag_error

    try:
        llm.resolve(DecodingOptions.from_kwargs(defaults))
    except OptionError as e:
        raise as_flag_error(e) from e


def served_name(model) -> str:
    """The name a model is served under by default: its folder's name."""
    return str(model).rstrip("/").split("/")[-1] if model else "dlrt-default"


def serve(llm_kwargs: dict, defaults: dict, host: str, port: int, max_queue: int,
          request_timeout: float, max_body_bytes: int, served_model_name: str | None = None,
          api_key: str | None = None) -> int:
    """Load `LLM(**llm_kwargs)` on every rank and serve it from rank 0 (blocks until shutdown)
    as `served_model_name` (default: the model folder's name), asking for `api_key` when set.
    Returns the process exit code (3: the server could not start)."""
    from dlrt import LLM

    ranks = Ranks()
    if llm_kwargs.get("device") in (None, "auto"):
        llm_kwargs = {**llm_kwargs, "device": ranks.device()}
    llm = LLM(**llm_kwargs)
    model = llm_kwargs.get("model")
    check_defaults(llm, defaults)  # on every rank: all of them stop
    if not ranks.leader:
        log.info("rank %d following rank 0", ranks.rank)
        follow(llm, ranks)
        return 0
    import uvicorn

    from dlrt.server.app import create_app

    name = served_model_name or served_name(model)
    worker = Worker(llm, ranks, max_queue=max_queue, timeout_s=request_timeout)
    app = create_app(llm, worker, name, defaults, max_body_bytes, api_key=api_key)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)  # a failed bind logs the error and exits
            if self.started:
                log.info("serving %s on http://%s:%d (%d rank(s)%s)", name, host, port,
                         ranks.world, ", API key required" if api_key else "")

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run()  # as uvicorn.run does
    except KeyboardInterrupt:
        pass
    finally:
        ranks.share_request(None)  # release the other ranks
    return 0 if server.started else 3  # uvicorn's STARTUP_FAILURE
