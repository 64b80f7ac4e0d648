"""Run under torchrun by the tensor-parallel tests: every rank loads the checkpoint cut
across the ranks, runs the same requests, and rank 0 writes every rank's token ids as JSON.

    torchrun --nproc-per-node 2 tests/unit/tp_generate.py CKPT OUT.json REQUESTS.json [OPTIONS]

CKPT may list one folder per rank, comma-separated (ranks that disagree on the checkpoint);
OPTIONS is a JSON object of engine options, plus "_modes" (run every request in each of these
execution modes: the output holds a list per mode) and "_sharpen" (multiply the LM head by it,
so threshold strategies commit varying numbers per round) and "_per_rank" (a list of options
objects, one per rank: ranks that disagree on an option).
"""

from __future__ import annotations

import json
import sys

from dlrt import LLM
from dlrt.distributed.ranks import Ranks


def main(ckpt: str, out: str, requests: str, options: str = "{}") -> int:
    ranks = Ranks()
    paths = ckpt.split(",")
    options = json.loads(options)
    modes, sharpen = options.pop("_modes", None), options.pop("_sharpen", None)
    per_rank = options.pop("_per_rank", None)  # a list: rank r adds per_rank[r] to options
    if per_rank:
        options.update(per_rank[ranks.rank])
    llm = LLM(paths[ranks.rank % len(paths)], **{"dtype": "float32", **options})
    if sharpen:  # an untied head (the tiny presets)
        head = next(m for n, m in llm.model.named_modules()
                    if n in ("lm_head", "model.transformer.ff_out"))
        head.weight.data *= sharpen
    mine = []
    for mode in modes or [None]:
        if mode is not None:
            llm.set_execution_mode(mode)
        ids = []
        for request in json.loads(open(requests).read()):
            prompt = request.pop("prompt")
            ids.append(llm.generate(prompt, **request).token_ids)
        mine.append(ids)
    mine = mine if modes else mine[0]
    every = ranks.all_gather(mine)
    if ranks.leader:
        with open(out, "w") as f:
            json.dump({"world": ranks.world, "tp": llm.engine.config.tensor_parallel_size,
                       "ranks": every}, f)
    ranks.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
