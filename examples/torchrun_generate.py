"""Generate under torchrun: every rank runs the same request and they check they agree.

    torchrun --nproc-per-node 2 examples/torchrun_generate.py       # two ranks (gloo on CPU)
    python examples/torchrun_generate.py                            # one process, world 1

Rank 0 chooses the request and shares it with the other ranks; every rank generates it on
its own device with its share of the model (under torchrun the model is cut across the ranks:
tensor parallelism, `tensor_parallel_size` defaults to the world size), so the ranks run every
block together; they then gather their token ids and rank 0 prints the text and whether all
ranks produced the same tokens. This is the pattern `dlrt serve` follows under torchrun.

Without --model this runs the embedded default: a 7.6M-parameter SDAR demonstration model
trained on the Python standard library, so its text is Python-looking code (printed with repr()).
"""

from __future__ import annotations

import argparse
import random

from dlrt import LLM
from dlrt.distributed.ranks import Ranks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None,
                        help="checkpoint folder (default: the embedded tiny SDAR model)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    ranks = Ranks()  # reads RANK / WORLD_SIZE from torchrun; joins a gloo group when world > 1
    llm = LLM(args.model, device=ranks.device())  # this rank's GPU, or the CPU

    # Rank 0 chooses the request; the others receive it (one process: returned as is).
    # Greedy decoding needs nothing else; sampling would also need the same seed on every
    # rank, so rank 0 chooses that too.
    request = None
    if ranks.leader:
        request = {"prompt": "The capital of France is", "max_new_tokens": args.max_new_tokens,
                   "temperature": 0.0, "seed": random.randrange(2**31)}
    request = ranks.share_request(request)

    prompt = request.pop("prompt")
    result = llm.generate(prompt, **request)

    # Every rank sends its token ids to every rank (world 1: just this rank's).
    per_rank = ranks.all_gather(result.token_ids)
    agree = all(ids == per_rank[0] for ids in per_rank)

    if ranks.leader:
        print(f"world: {ranks.world}")
        print(f"text: {result.text!r}")
        print(f"finish_reason: {result.finish_reason}")
        print(f"tokens per rank: {[len(ids) for ids in per_rank]}")
        print(f"ranks agree: {agree}")
    ranks.close()
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
