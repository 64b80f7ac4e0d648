"""Run by `tests/e2e/test_server_shutdown.py`: `dlrt serve` over a model whose requests hang
after their first block (as on a device that never finishes a block).

    python tests/unit/serve_hung.py dlrt serve --model CKPT [FLAGS]
"""

from __future__ import annotations

import sys
import threading

import dlrt
from dlrt.entrypoints.cli import main


class Hangs:
    """A loaded LLM whose streams never deliver their second block."""

    def __init__(self, llm):
        self._llm = llm

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def stream(self, *args, **kwargs):
        for block in self._llm.stream(*args, **kwargs):
            yield block
            threading.Event().wait()  # the next block never comes


if __name__ == "__main__":
    load = dlrt.LLM
    dlrt.LLM = lambda *args, **kwargs: Hangs(load(*args, **kwargs))
    raise SystemExit(main(sys.argv[2:]))
