"""The `renoise` decoder (DiffusionGemma) in the three execution modes on the GPU (marked
`gpu`): device_loop (one CUDA graph per canvas, its WHILE node reading the canvas state's
flag), host_loop and eager commit identical tokens, rounds and stops; one captured graph set
serves every context and value; begin, round and end never synchronise with the host.

The model is `tiny_diffusion_gemma_graphs` (tests/conftest.py): what the capturable backend,
`triton`, and the PyTorch MoE's gather path serve.
"""

from __future__ import annotations

import pytest
import torch
from test_execution_modes import _assert_same, _run_modes

from dlrt import LLM

pytestmark = pytest.mark.gpu

OPTIONS = [
    dict(max_denoising_steps=6, entropy_bound=0.5),
    dict(max_denoising_steps=12, entropy_bound=1e4, stability_threshold=0,
         confidence_threshold=3.0, t_min=0.05, t_max=0.2),
    dict(max_denoising_steps=8, entropy_bound=1e-3, stability_threshold=2, t_min=0.0,
         t_max=0.1),
]


@pytest.fixture(scope="module")
def diffusion_gemma(tiny_diffusion_gemma_graphs):
    llm = LLM(str(tiny_diffusion_gemma_graphs), device="cuda", dtype="bfloat16",
              max_model_len=4096)
    assert llm.engine_config.attention_backend == "triton"
    return llm


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("prompt_len", [1, 37, 1500])
def test_renoise_modes_identical(diffusion_gemma, options, prompt_len):
    prompt = [2 + (7 * i + 11) % 8000 for i in range(prompt_len)]  # never the image id (1)
    for seed in (0, 5):
        out = _run_modes(diffusion_gemma, prompt, max_new_tokens=45, seed=seed,
                         ignore_eos=True, **options)
        _assert_same(out)
        tokens, steps, _, finish = out["eager"]
        assert len(tokens) == 45 and len(steps) == 3 and finish == "length"


def test_one_graph_set_serves_every_context_and_value(diffusion_gemma):
    llm = diffusion_gemma
    llm.set_execution_mode("device_loop")
    llm.generate([3, 4, 5], max_new_tokens=40, seed=1, **OPTIONS[0])
    captured = set(llm.executor._graphs)
    for n, options in ((90, OPTIONS[1]), (2000, OPTIONS[2])):
        llm.generate(list(range(10, 10 + n)), max_new_tokens=40, seed=2, **options)
    assert set(llm.executor._graphs) == captured
    assert {k[1:] for k in captured} >= {("first", "device_loop"), ("next", "device_loop")}
    assert len(llm.decoder.programs) == 1


def test_a_canvas_never_synchronises_with_the_host(diffusion_gemma):
    llm = diffusion_gemma
    llm.set_execution_mode("eager")
    llm.generate(list(range(2, 22)), max_new_tokens=40, seed=1, **OPTIONS[0])
    (prog,) = llm.decoder.programs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            prog.begin_next()
            prog.round()
            prog.end()
    finally:
        torch.cuda.set_sync_debug_mode(0)
