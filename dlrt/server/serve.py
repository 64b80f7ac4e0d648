"""`dlrt serve`: load the model on every rank; rank 0 serves HTTP (uvicorn), the others follow."""

from __future__ import annotations

import logging

from dlrt.distributed.ranks import Ranks
from dlrt.server.worker import Worker, follow

log = logging.getLogger("dlrt.server")


def serve(model: str | None, llm_kwargs: dict, defaults: dict, host: str, port: int,
          max_queue: int, request_timeout: float, max_body_bytes: int) -> int:
    from dlrt import LLM

    ranks = Ranks()
    if llm_kwargs.get("device") in (None, "auto"):
        llm_kwargs = {**llm_kwargs, "device": ranks.device()}
    llm = LLM(model, **llm_kwargs)
    if not ranks.leader:
        log.info("rank %d following rank 0", ranks.rank)
        follow(llm, ranks)
        return 0
    import uvicorn

    from dlrt.server.app import create_app

    name = str(model).rstrip("/").split("/")[-1] if model else "dlrt-default"
    worker = Worker(llm, ranks, max_queue=max_queue, timeout_s=request_timeout)
    app = create_app(llm, worker, name, defaults, max_body_bytes)
    log.info("serving %s on http://%s:%d (%d rank(s))", name, host, port, ranks.world)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        ranks.share_request(None)  # release the other ranks
    return 0
