"""Run under torchrun by `tests/e2e/test_weights_torchrun.py`: weight updates, sleep and wake of
a model cut across the ranks.

    torchrun --nproc-per-node 2 tests/unit/tp_weights.py CKPT_A CKPT_B OUT.json [OPTIONS]

OPTIONS: a JSON object of engine options (such as {"data_parallel_size": 2}). Each time, rank 0
generates the prompt once per data-parallel group (a list: each group runs one). Rank 0
generates with checkpoint A, updates to B's tensors (a mapping: every rank takes its
slices of rank 0's full tensors), back to A's folder, refuses a tensor of the wrong shape,
sleeps (level 1) and wakes, sleeps (level 2) and updates to B's folder then wakes, sleeps
(level 2) and wakes with A's folder; it writes the tokens after each step and the errors.
Every rank appends what its engine did (sleep level and KV-cache bytes after it, wake) to
OUT.json.events.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from safetensors.torch import load_file

from dlrt import LLM
from dlrt.engine.lifecycle import Lifecycle

RANK = int(os.environ.get("RANK", "0"))
PROMPT = [5, 6, 7, 8, 9, 10]
REQUEST = dict(max_new_tokens=8, temperature=0.0, seed=0, ignore_eos=True)


def record_events(path: str) -> None:
    """Every rank's engine appends each sleep (with its KV-cache bytes after it) and wake."""
    sleep, wake = Lifecycle.sleep, Lifecycle.wake_up

    def note(text: str) -> None:
        with open(path, "a") as f:
            f.write(f"rank {RANK} {text}\n")

    def sleeping(self, level=1):
        sleep(self, level)
        note(f"sleep {level} kv {self.runner.cache.nbytes}")

    def waking(self, update=None):
        wake(self, update)
        note(f"wake kv {self.runner.cache.nbytes}")

    Lifecycle.sleep, Lifecycle.wake_up = sleeping, waking


def error_of(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - what rank 0's caller gets is the point
        return f"{type(e).__name__}: {e}"
    return "no error"


def main(a: str, b: str, out: str, options: str = "{}") -> int:
    record_events(out + ".events")
    result = {}

    def tokens(llm: LLM) -> list[list[int]]:
        prompts = [PROMPT] * llm.data_parallel_size
        return [r.token_ids for r in llm.generate(prompts, **REQUEST)]

    with LLM(a, **{"dtype": "float32", **json.loads(options)}) as llm:
        result["tp"] = llm.engine.config.tensor_parallel_size
        result["dp"] = llm.data_parallel_size
        result["a"] = tokens(llm)
        b_tensors = load_file(str(Path(b) / "model.safetensors"))
        llm.update_weights(b_tensors)
        result["b_mapping"] = tokens(llm)
        llm.update_weights(a)
        result["a_folder"] = tokens(llm)
        bad = dict(b_tensors)
        name = next(k for k in bad if k.endswith("o_proj.weight") or k.endswith("dense.weight"))
        bad[name] = bad[name][:, :-1].clone()
        result["shape_error"] = error_of(lambda: llm.update_weights(bad))
        result["after_error"] = tokens(llm)
        llm.sleep(1)
        result["asleep_error"] = error_of(lambda: tokens(llm))
        llm.wake_up()
        result["a_wake"] = tokens(llm)
        llm.sleep(2)
        llm.update_weights(b)
        llm.wake_up()
        result["b_sleep2"] = tokens(llm)
        llm.sleep(2)
        llm.wake_up(a)
        result["a_sleep2"] = tokens(llm)
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
