"""Run under torchrun by the tensor-parallel tests: every rank loads the checkpoint cut across
the ranks; rank 0 (the only one past `LLM(...)`) runs the requests, then runs them again on
every rank through `collective_rpc`, and writes its own token ids and every rank's as JSON.

    torchrun --nproc-per-node 2 tests/unit/tp_generate.py CKPT OUT.json REQUESTS.json [OPTIONS]

CKPT may list one folder per rank, comma-separated (ranks that disagree on the checkpoint);
OPTIONS is a JSON object of engine options, plus "_modes" (run every request in each of these
execution modes: the output holds a list per mode) and "_sharpen" (multiply the LM head by it,
so threshold strategies commit varying numbers per round) and "_per_rank" (a list of options
objects, one per rank: ranks that disagree on an option).
"""

from __future__ import annotations

import json
import os
import sys

from dlrt import LLM


def sharpen(llm: LLM, factor: float) -> None:
    """Multiply the LM head (untied in the tiny presets) by `factor` on this rank."""
    head = next(m for n, m in llm.model.named_modules()
                if n in ("lm_head", "model.transformer.ff_out"))
    head.weight.data *= factor


def run(llm: LLM, requests: list[dict], modes: list | None) -> list:
    """The requests' token ids (a list per mode when `modes` is given)."""
    mine = []
    for mode in modes or [None]:
        if mode is not None:
            llm.set_execution_mode(mode)
        ids = []
        for request in requests:
            request = dict(request)
            prompt = request.pop("prompt")
            ids.append(llm.generate(prompt, **request).token_ids)
        mine.append(ids)
    return mine if modes else mine[0]


def main(ckpt: str, out: str, requests: str, options: str = "{}") -> int:
    rank = int(os.environ.get("RANK", "0"))  # this script's own choice of options per rank
    paths = ckpt.split(",")
    options = json.loads(options)
    modes, factor = options.pop("_modes", None), options.pop("_sharpen", None)
    per_rank = options.pop("_per_rank", None)  # a list: rank r adds per_rank[r] to options
    if per_rank:
        options.update(per_rank[rank])
    with LLM(paths[rank % len(paths)], **{"dtype": "float32", **options}) as llm:
        if factor:
            llm.collective_rpc(sharpen, factor)
        requests = json.loads(open(requests).read())
        leader = run(llm, requests, modes)
        every = llm.collective_rpc(run, requests, modes)
        with open(out, "w") as f:
            json.dump({"world": llm.world_size, "tp": llm.engine.config.tensor_parallel_size,
                       "leader": leader, "ranks": every}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
