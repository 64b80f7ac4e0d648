"""The Triton attention backend inside the model equals the SDPA reference backend (CPU: Triton
interpreter; fp32, relative error < 1e-5), and decoding through it gives the same tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt import LLM, OptionError  # noqa: E402

B = 4


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module")
def pair(tiny_sdar):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(dtype="float32", device=dev, execution_mode="eager", max_model_len=256)
    ref = LLM(tiny_sdar, attention_backend="sdpa", **kw)
    tri = LLM(tiny_sdar, attention_backend="triton", **kw)
    for llm in (ref, tri):  # sharper distributions: greedy choices are far from ties
        llm.model.lm_head.weight.data *= 50
    return ref, tri


def test_prefill_and_cached_block_logits_match(pair):
    ids = torch.randint(0, 150000, (23,), generator=torch.Generator().manual_seed(0))
    ids = ids.to(pair[0].device)
    out = []
    for llm in pair:
        run = llm.runner
        full = run.forward_at(ids[:20], 0, chunk_block=B)
        block = run.forward_at(ids[20:], 20, chunk_block=B)  # odd chunk over a cached prefix
        out.append((full, block))
    assert _rel(out[1][0], out[0][0]) < 1e-5
    assert _rel(out[1][1], out[0][1]) < 1e-5


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "sequential"])
def test_greedy_tokens_match(pair, strategy):
    prompt = list(range(2000, 2011))  # 11 tokens: block 0 holds 3 fixed prompt tokens
    res = [llm.generate(prompt, max_new_tokens=13, temperature=0, remasking_strategy=strategy,
                        threshold=0.3) for llm in pair]
    assert res[1].token_ids == res[0].token_ids
    assert res[1].denoise_steps == res[0].denoise_steps
    assert res[1].commit_rounds == res[0].commit_rounds


def test_graph_modes_need_cuda_and_a_capturable_backend(tiny_sdar):
    if torch.cuda.is_available():
        with pytest.raises(OptionError, match="capturable"):
            LLM(tiny_sdar, attention_backend="sdpa", execution_mode="device_loop")
    else:
        for mode in ("device_loop", "host_loop"):
            with pytest.raises(OptionError, match="needs a CUDA device"):
                LLM(tiny_sdar, execution_mode=mode)
    with pytest.raises(OptionError, match="execution_mode"):
        LLM(tiny_sdar, execution_mode="warp")
