"""The Triton ops keep greedy tokens (GPU, marked `gpu`).

The same checkpoint decoded greedily with the Triton ops table (`kernels="triton"`, the CUDA
default) and with the reference PyTorch ops (`kernels="reference"`) commits the same tokens.
fp32 weights, where the kernels' rounding differences (ulps of the fp32 statistics) cannot flip
an argmax on these prompts; in bf16 a near-tie can flip, which `dlrt bench humaneval` reports
rather than a test asserting it. With `linear_kernels="triton"` every projection shape that has
a Triton config takes the skinny GEMM.
"""

from __future__ import annotations

import pytest

from dlrt import LLM
from dlrt.tuning.linear import linear_layers

pytestmark = pytest.mark.gpu

PROMPTS = [[(13 * i + 5) % 1000 for i in range(n)] for n in (1, 7, 300)]


def _llm(path, **kw) -> LLM:
    return LLM(path, device="cuda", dtype="float32", max_model_len=2048, **kw)


@pytest.mark.parametrize("ckpt,decoder", [("tiny_sdar", None), ("tiny_sdar_moe", None),
                                          ("tiny_llada", "canvas"), ("tiny_llada", "dllm_var")])
@pytest.mark.parametrize("mode", ["eager", "device_loop"])
@pytest.mark.parametrize("linear", ["auto", "triton"])
def test_triton_equals_reference_greedy(ckpt, decoder, mode, linear, request):
    path = request.getfixturevalue(ckpt)
    llm = _llm(path, decoder=decoder, execution_mode=mode, linear_kernels=linear)
    ref = _llm(path, decoder=decoder, execution_mode="eager", kernels="reference")
    assert llm.engine.ops.name == "triton" and ref.engine.ops.name == "reference"
    if linear == "triton":  # every shape with a Triton config takes it
        records = llm.linear_plan.records
        assert records and all(r["chosen"] == "triton" for r in records.values()
                               if r["config"] is not None), records
    assert {m.method.name for m in linear_layers(ref.model).values()} == {"cublas"}
    opts = dict(max_new_tokens=24, temperature=0, block_length=4,
                remasking_strategy="low_confidence_dynamic", ignore_eos=True)
    fused = [llm.generate(p, **opts).token_ids for p in PROMPTS]
    assert fused == [ref.generate(p, **opts).token_ids for p in PROMPTS]
    assert all(len(t) == 24 for t in fused)


@pytest.mark.parametrize("mode", ["eager", "device_loop"])
def test_triton_equals_reference_sampling(tiny_sdar, mode):
    """Seeded sampling (temperature, top-k, top-p): the fused draw (`dlrt.kernels.sampling`)
    commits the tokens of the PyTorch reference draw on the same noise."""
    llm = _llm(tiny_sdar, execution_mode=mode)
    ref = _llm(tiny_sdar, execution_mode="eager", kernels="reference")
    runs = [[[m.generate(p, max_new_tokens=24, block_length=4, temperature=t, top_k=k, top_p=q,
                         seed=11, ignore_eos=True).token_ids
              for t, k, q in ((0.8, 50, 0.9), (1.2, 0, 0.95), (0.7, 0, 1.0))]
             for p in PROMPTS] for m in (llm, ref)]
    assert runs[0] == runs[1]
