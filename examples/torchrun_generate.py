"""Generate under torchrun: rank 0 asks, every rank runs the request, and they check they agree.

    torchrun --nproc-per-node 2 examples/torchrun_generate.py       # two ranks (gloo on CPU)
    python examples/torchrun_generate.py                            # one process, world 1

Every rank runs this script. `LLM(...)` loads the model on every rank, cut across them (tensor
parallelism: `tensor_parallel_size` defaults to the world size), and returns only on rank 0:
the other ranks run each of rank 0's calls with it (block for block) and end when its LLM
closes. So the rest of the script is rank 0's alone, and it prints once. `collective_rpc` runs a
function on every rank and returns each rank's result: here every rank's token ids of the same
request, which rank 0 compares. This is how `dlrt serve` runs under torchrun.

Without --model this runs the embedded default: a 7.6M-parameter SDAR demonstration model
trained on the Python standard library, so its text is Python-looking code (printed with repr()).
"""

from __future__ import annotations

import argparse

from dlrt import LLM


def token_ids(llm: LLM, prompt: str, options: dict) -> list[int]:
    """One rank's token ids of the request (run on every rank by collective_rpc)."""
    return llm.generate(prompt, **options).token_ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None,
                        help="checkpoint folder (default: the embedded tiny SDAR model)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    with LLM(args.model) as llm:  # on rank 0 only past this line; the others follow it
        prompt = "The capital of France is"
        options = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0}
        result = llm.generate(prompt, **options)
        per_rank = llm.collective_rpc(token_ids, prompt, options)
        agree = all(ids == result.token_ids for ids in per_rank)
        print(f"world: {llm.world_size}")
        print(f"text: {result.text!r}")
        print(f"finish_reason: {result.finish_reason}")
        print(f"tokens per rank: {[len(ids) for ids in per_rank]}")
        print(f"ranks agree: {agree}")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
