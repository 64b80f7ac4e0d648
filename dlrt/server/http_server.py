"""uvicorn's server with dlrt's start line and shutdown.

The first SIGINT or SIGTERM logs how many requests run and wait, stops taking connections and
drains: uvicorn waits for every open request, so the running one and the queued ones finish.
A second SIGINT refuses the queued requests (503, `Worker.refuse_waiting`) and cancels the
running one at its next block; `run` returns only after the generation thread has stopped
(`Worker.close`), so the LLM can close after it. A third SIGINT ends the process at once with
status 130 and one line, waiting for nothing (a block that never ends, on a hung device).

Once the model can run no more requests (`Worker.lost`: under torchrun, a rank stopped), the
server logs why in one line, refuses the queued requests and stops (`lost`), as an
orchestrator expects of a server whose `/health` fails.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from dlrt.server.routes.health import lost_reason
from dlrt.server.worker import Worker

log = logging.getLogger("dlrt.server")


class HTTPServer(uvicorn.Server):
    """Serves `app` on host:port (uvicorn, its own logs at warning level); `started()` is
    called once it listens. `signals`: the signals received, in order; `lost`: why it
    stopped by itself (the model can run no more requests), or None."""

    def __init__(self, app: FastAPI, worker: Worker, host: str, port: int,
                 started: Callable[[], None]):
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.worker = worker
        self.signals: list[int] = []
        self.lost: str | None = None
        self._started = started

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)  # a failed bind logs the error and exits
        if self.started:
            self._started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # NOTE: replaces uvicorn's, which would raise the signal again once the server stopped
        self.signals.append(sig)
        name = signal.Signals(sig).name
        worker = self.worker
        if not self.should_exit:
            log.info("%s: stopping; draining %d running and %d queued request(s) (SIGINT "
                     "again: refuse the queued ones with 503)", name, worker.running,
                     worker.waiting)
            self.should_exit = True
        elif sig == signal.SIGINT and not worker.refusing:
            log.info("%s again: refusing %d queued request(s) with 503, cancelling %d running "
                     "at its next block (SIGINT again: stop at once)", name, worker.waiting,
                     worker.running)
            worker.refuse_waiting()
        elif sig == signal.SIGINT:
            log.warning("%s a third time: stopping at once (the running block is not waited "
                        "for, the model is not closed)", name)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + sig)

    async def on_tick(self, counter: int) -> bool:
        if self.lost is None and self.worker.lost is not None:
            self.lost = self.worker.lost
            log.error("stopping: %s", lost_reason(self.lost))
            self.worker.refuse_waiting()
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        await self.worker.close()
