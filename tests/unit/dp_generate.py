"""Run under torchrun by the data-parallel tests: every rank loads the checkpoint; rank 0 (the
only one past `LLM(...)`) generates for a list of prompts (shared among the data-parallel
groups), then again on every rank through `collective_rpc` (each group runs its share, every
rank returns the whole list), and writes the token ids, the shares and the requests each rank
ran as JSON, a list per job.

    torchrun --nproc-per-node N tests/unit/dp_generate.py CKPT OUT.json JOBS.json [OPTIONS]

JOBS.json: [{"prompts": [...], "options": {...}}, ...] (each list call's prompts and options);
OPTIONS: a JSON object of engine options.
"""

from __future__ import annotations

import json
import sys

from dlrt import LLM


def requests_run(llm: LLM) -> int:
    """The requests this rank has run so far."""
    return llm._request


def ids_of(llm: LLM, prompts: list, options: dict) -> list[list[int]]:
    """The token ids of `generate(prompts)` on this rank."""
    return [r.token_ids for r in llm.generate(prompts, **options)]


def main(ckpt: str, out: str, jobs: str, options: str = "{}") -> int:
    with LLM(ckpt, **{"dtype": "float32", **json.loads(options)}) as llm:
        done = []
        for job in json.loads(open(jobs).read()):
            prompts, opts = job["prompts"], job["options"]
            before = llm.collective_rpc(requests_run)
            leader = [r.token_ids for r in llm.generate(prompts, **opts)]
            after = llm.collective_rpc(requests_run)
            done.append({"shares": llm.share(prompts, **opts),
                         "ran": [a - b for a, b in zip(after, before, strict=True)],
                         "leader": leader, "ranks": llm.collective_rpc(ids_of, prompts, opts)})
        with open(out, "w") as f:
            json.dump({"world": llm.world_size, "dp": llm.data_parallel_size,
                       "tp": llm.engine_config.tensor_parallel_size, "jobs": done}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
