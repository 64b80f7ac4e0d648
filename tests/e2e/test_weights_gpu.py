"""Weight updates, sleep and wake on a GPU (marked `gpu`).

With captured graphs (host_loop, device_loop) an update is copied into the captured weights:
the next request gives a fresh engine's tokens of the new checkpoint with no recapture (the
capture count and the graph objects unchanged), for SDAR, SDAR-MoE, LLaDA, LLaDA2 and FP8
quantised while loading. Sleeping frees memory (allocated: awake > after sleep(1) >= after
sleep(2)), waking recaptures and gives the tokens of before, the persistent round included.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import preset

pytestmark = pytest.mark.gpu

PROMPT = [5, 6, 7, 8, 9, 10]
REQUEST = dict(max_new_tokens=12, temperature=0.0, seed=0, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    made = {}

    def get(preset: str) -> tuple[Path, Path]:
        if preset not in made:
            root = tmp_path_factory.mktemp(preset)
            folders = []
            for seed in (0, 1):
                full = make_checkpoint(preset, root / f"full{seed}", seed=seed,
                                       dtype="bfloat16")
                dst = root / f"seed{seed}"
                dst.mkdir()
                for name in ("model.safetensors", "config.json", "generation_config.json"):
                    os.symlink(full / name, dst / name)
                folders.append(dst)
            made[preset] = tuple(folders)
        return made[preset]
    return get


def tokens(llm: LLM) -> list[int]:
    return llm.generate(PROMPT, **REQUEST).token_ids


@pytest.mark.parametrize("mode", ["host_loop", "device_loop"])
@pytest.mark.parametrize("preset,options", [
    ("tiny-sdar", {}), ("tiny-sdar-moe", {}), ("tiny-llada", {}), ("tiny-llada2", {}),
    ("tiny-sdar-moe", {"quantization": "fp8"}),
])
def test_update_reuses_the_captured_graphs(pair, preset, options, mode):
    a, b = pair(preset)
    kw = dict(device="cuda", execution_mode=mode, **options)
    llm = LLM(a, **kw)
    want_a = tokens(llm)
    want_b = tokens(LLM(b, **kw))
    assert want_a != want_b
    captures, graphs = llm.executor.captures, dict(llm.executor._graphs)
    assert captures > 0 and graphs
    llm.update_weights(load_file(str(b / "model.safetensors")))
    assert tokens(llm) == want_b
    llm.update_weights(a)
    assert tokens(llm) == want_a
    assert llm.executor.captures == captures
    assert llm.executor._graphs.keys() == graphs.keys()
    assert all(llm.executor._graphs[k] is g for k, g in graphs.items())


def allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """tiny-sdar with head_dim 32 (what the persistent round serves)."""
    hf = preset("tiny-sdar")[0]
    hf.update(head_dim=32, hidden_size=96, intermediate_size=160, num_hidden_layers=3)
    src = tmp_path_factory.mktemp("cfg")
    (src / "config.json").write_text(json.dumps(hf))
    return make_checkpoint(src, tmp_path_factory.mktemp("wide") / "ckpt", dtype="bfloat16")


@pytest.mark.parametrize("round_kernel", ["layers", "persistent"])
def test_sleep_frees_memory_and_wake_gives_the_same_tokens(wide_heads, round_kernel):
    """The persistent round holds the weights' and the cache's addresses: rebuilt on wake."""
    a = wide_heads
    llm = LLM(a, device="cuda", dtype="bfloat16", execution_mode="device_loop",
              max_model_len=4096, round_kernel=round_kernel)
    before = tokens(llm)
    awake, reserved = allocated(), torch.cuda.memory_reserved()
    llm.sleep(1)
    one = allocated()
    assert torch.cuda.memory_reserved() < reserved
    captures = llm.executor.captures
    llm.wake_up()
    assert tokens(llm) == before
    assert llm.executor.captures > captures  # captured again on first use
    llm.sleep(2)
    two = allocated()
    assert awake > one >= two, (awake, one, two)
    llm.wake_up(a)
    assert tokens(llm) == before
    assert all(p.is_cuda and p.is_contiguous() for p in llm.model.parameters())
