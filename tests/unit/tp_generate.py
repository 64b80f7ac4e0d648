"""Run under torchrun by the tensor-parallel tests: every rank loads the checkpoint cut
across the ranks, runs the same requests, and rank 0 writes every rank's token ids as JSON.

    torchrun --nproc-per-node 2 tests/unit/tp_generate.py CKPT OUT.json REQUESTS.json [OPTIONS]

CKPT may list one folder per rank, comma-separated (ranks that disagree on the checkpoint);
OPTIONS is a JSON object of engine options.
"""

from __future__ import annotations

import json
import sys

from dlrt import LLM
from dlrt.distributed.ranks import Ranks


def main(ckpt: str, out: str, requests: str, options: str = "{}") -> int:
    ranks = Ranks()
    paths = ckpt.split(",")
    llm = LLM(paths[ranks.rank % len(paths)], **{"dtype": "float32", **json.loads(options)})
    mine = []
    for request in json.loads(open(requests).read()):
        prompt = request.pop("prompt")
        mine.append(llm.generate(prompt, **request).token_ids)
    every = ranks.all_gather(mine)
    if ranks.leader:
        with open(out, "w") as f:
            json.dump({"world": ranks.world, "tp": llm.engine.config.tensor_parallel_size,
                       "ranks": every}, f)
    ranks.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
