"""Quantised checkpoints on CUDA (GPU, marked `gpu`): FP8, NVFP4 and compressed-tensors FP8
tiny checkpoints load with their formats on the device, online quantisation equals the written
checkpoint there too, and the three execution modes commit identical tokens (the projections
take the low-precision kernels the load-time plan sets, else the dequantising path; the Triton
MoE reads FP8 experts directly and dequantises the others inside the graphs). The LM head is
sharpened (x50) so threshold strategies commit varying numbers. A quantised tiny
DiffusionGemma (its `renoise` decoder, `triton` attention, GELU experts) commits identical
tokens, rounds and stops in the three modes too. Tolerances: kernel outputs within 1e-2
relative L2 of the reference path; a planned compressed-tensors model's logits within 5e-2 of
the reference path's (the load-time plan checks each kernel against 2e-2; a model's layers add
up: 2.4e-2 and 3.1e-2 were measured on an H200)."""

from __future__ import annotations

import logging

import pytest
import torch

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint

pytestmark = pytest.mark.gpu

MODES = ("device_loop", "host_loop", "eager")
CT = "compressed-tensors-fp8"
DG = "tiny-diffusion-gemma"
# renoise options: few rounds with a tight acceptance; every position accepted and no early
# stop at low temperatures
DG_OPTIONS = [dict(max_denoising_steps=6, entropy_bound=0.5),
              dict(max_denoising_steps=12, entropy_bound=1e4, stability_threshold=0,
                   confidence_threshold=3.0, t_min=0.05, t_max=0.2)]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    cache: dict = {}

    def get(preset: str, quantization: str = "none"):
        if (preset, quantization) not in cache:
            out = tmp_path_factory.mktemp("quant-gpu") / "ckpt"
            cache[preset, quantization] = make_checkpoint(preset, out,
                                                          quantization=quantization)
        return cache[preset, quantization]
    return get


def _llm(path, **kw):
    return LLM(path, device="cuda", dtype="bfloat16", max_model_len=4096, **kw)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("preset", ["tiny-sdar", "tiny-sdar-moe"])
def test_fp8_checkpoint_on_cuda(made, preset, caplog):
    with caplog.at_level(logging.WARNING, logger="dlrt"):
        offline = _llm(made(preset, "fp8"))
    old = torch.cuda.get_device_capability() < (8, 9)
    assert any("no FP8 tensor cores" in r.message for r in caplog.records) == old
    online = _llm(made(preset), quantization="fp8")
    a = dict(offline.model.named_parameters())
    b = dict(online.model.named_parameters())
    fp8 = [n for n, p in a.items() if p.dtype == torch.float8_e4m3fn]
    assert fp8 and all(a[n].is_cuda for n in a)
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)
    prompt = [(7 * i + 11) % 150000 for i in range(13)]
    assert offline.generate(prompt, max_new_tokens=16).token_ids == \
        online.generate(prompt, max_new_tokens=16).token_ids


@pytest.mark.parametrize("quantization", ["fp8", "fp8:weight_only", "nvfp4", CT,
                                          f"{CT}:weight_only"])
@pytest.mark.parametrize("preset", ["tiny-sdar", "tiny-sdar-moe", "tiny-llada2"])
@pytest.mark.parametrize("strategy", ["low_confidence_static", "threshold"])
def test_quantised_modes_identical(made, preset, quantization, strategy):
    quantization, _, mode = quantization.partition(":")
    llm = _llm(made(preset, quantization), **({"fp8_activations": mode} if mode else {}))
    llm.model.lm_head.weight.data *= 50
    prompt = [(5 * i + 3) % 150000 for i in range(37)]
    out = {}
    for mode in MODES:
        llm.set_execution_mode(mode)
        r = llm.generate(prompt, max_new_tokens=24, remasking_strategy=strategy,
                         threshold=0.3)
        out[mode] = (r.token_ids, r.denoise_steps, r.finish_reason)
    assert out["device_loop"] == out["host_loop"] == out["eager"], out


@pytest.mark.parametrize("activations", ["dynamic", "weight_only"])
@pytest.mark.parametrize("m", [1, 3, 16, 80])
def test_fp8_kernel_seam(m, activations):
    """`Fp8Linear.kernel` set to the block-scaled FP8 GEMM of the activation mode (W8A8 for
    dynamic) serves up to `max_rows` rows and matches the reference path of the same mode
    (fp32 sums in both: summation order only); more rows take the reference path."""
    import functools

    from dlrt.kernels.fp8_gemm import fp8_config, fp8_gemm
    from dlrt.layers.linear import Linear
    from dlrt.layers.quant.convert import quantize_module
    from dlrt.layers.quant.fp8 import FP8_FORMAT, Fp8Linear, quantize_fp8_block

    n, k = 384, 1000
    with torch.device("meta"):
        layer = Linear(k, n)
    quantize_module(layer, FP8_FORMAT)
    w, s = quantize_fp8_block(torch.randn(n, k, device="cuda") * 0.02)
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(s, requires_grad=False)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    layer.method = Fp8Linear(activations=activations)
    ref = layer(x)  # no kernel: the reference path
    calls = []
    gemm = fp8_gemm if activations == "weight_only" else functools.partial(
        fp8_gemm, config=fp8_config(min(m, 64), n, k, w8a8=True))
    layer.method = Fp8Linear(kernel=lambda *a: calls.append(1) or gemm(*a),
                             activations=activations)
    out = layer(x)
    assert len(calls) == (1 if m <= 64 else 0)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2


@pytest.mark.parametrize("m", [1, 3, 80])
def test_nvfp4_kernel_seam(m):
    """`Nvfp4Linear.kernel` set to the NVFP4 GEMM (global scale per row: a merged projection
    whose parts have their own) matches the dequantising reference; more rows take it."""
    from dlrt.kernels.nvfp4_gemm import nvfp4_gemm
    from dlrt.layers.linear import MergedLinear
    from dlrt.layers.quant.convert import quantize_module
    from dlrt.layers.quant.nvfp4 import NVFP4_FORMAT, Nvfp4Linear, quantize_nvfp4

    k = 1024
    with torch.device("meta"):
        layer = MergedLinear(k, {"a": 256, "b": 128})
    quantize_module(layer, NVFP4_FORMAT)
    parts = [quantize_nvfp4(torch.randn(n, k, device="cuda") * scale)
             for n, scale in ((256, 0.02), (128, 0.5))]
    layer.weight = torch.nn.Parameter(torch.cat([p[0] for p in parts]), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(torch.cat([p[1] for p in parts]),
                                            requires_grad=False)
    layer.weight_scale_2 = torch.nn.Parameter(
        torch.cat([p[2].expand(n) for p, n in zip(parts, (256, 128), strict=True)]),
        requires_grad=False)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = layer(x)
    calls = []
    layer.method = Nvfp4Linear(kernel=lambda *a: calls.append(1) or nvfp4_gemm(*a))
    out = layer(x)
    assert len(calls) == (1 if m <= 64 else 0)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2


def test_fp8_plan_on_cuda(made):
    """An FP8 tiny checkpoint with the Triton kernels gets a plan for its block-layout layers
    (every candidate recorded, a chosen kernel set on its layers), and the three execution
    modes commit identical tokens with it."""
    from dlrt.layers.quant.fp8 import Fp8Linear
    from dlrt.tuning.quant import REFERENCE

    llm = _llm(made("tiny-sdar", "fp8"), kernels="triton", linear_kernels="triton")
    quant = {k: r for k, r in llm.linear_plan.records.items() if k.startswith("fp8,")}
    assert quant and all(r["candidates"] for r in quant.values())
    assert all(r["chosen"] == REFERENCE or r["candidates"][r["chosen"]]["us"] is not None
               for r in quant.values())
    kernels = [m.method for m in llm.model.modules()
               if isinstance(getattr(m, "method", None), Fp8Linear) and m.method.kernel]
    assert kernels  # policy triton: the fastest passing candidate everywhere one passes
    prompt = [(5 * i + 3) % 150000 for i in range(37)]
    out = {}
    for mode in MODES:
        llm.set_execution_mode(mode)
        r = llm.generate(prompt, max_new_tokens=24)
        out[mode] = (r.token_ids, r.denoise_steps, r.finish_reason)
    assert out["device_loop"] == out["host_loop"] == out["eager"], out


@pytest.mark.parametrize("preset", ["tiny-sdar", "tiny-sdar-moe"])
def test_compressed_tensors_on_cuda(made, preset):
    """A compressed-tensors FP8 checkpoint equals its online quantisation on the device, bit
    for bit and in tokens; with the Triton kernels (policy "triton") every weight shape of its
    layers gets a record of checked candidates, per-channel kernels are set where one passes,
    the logits are within 5e-2 of the reference path's (`linear_kernels="cublas"`), and the
    three execution modes commit the same tokens."""
    from dlrt.layers.quant.compressed_tensors import CtFp8Linear
    from dlrt.tuning.quant import REFERENCE

    offline = _llm(made(preset, CT), linear_kernels="cublas")  # the reference path
    online = _llm(made(preset), quantization=CT, linear_kernels="cublas")
    a = dict(offline.model.named_parameters())
    b = dict(online.model.named_parameters())
    assert [n for n, p in a.items() if p.dtype == torch.float8_e4m3fn]
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)
    prompt = [(7 * i + 11) % 150000 for i in range(13)]
    assert offline.generate(prompt, max_new_tokens=16).token_ids == \
        online.generate(prompt, max_new_tokens=16).token_ids
    llm = _llm(made(preset, CT), kernels="triton", linear_kernels="triton")
    quant = {k: r for k, r in llm.linear_plan.records.items() if k.startswith(CT + ",")}
    assert quant and all(r["candidates"] for r in quant.values())
    layers = [m for m in llm.model.modules() if isinstance(getattr(m, "method", None),
                                                           CtFp8Linear)]
    assert layers and any(m.method.kernel for m in layers)
    assert {tuple(m.weight.shape) for m in layers} == \
        {tuple(int(v) for v in key.split(",")[1:3]) for key in quant}
    assert all(r["chosen"] == REFERENCE or r["candidates"][r["chosen"]]["us"] is not None
               for r in quant.values())
    ids = torch.tensor(prompt, device="cuda")
    ours = llm.runner.forward_at(ids, 0, chunk_block=4).float()
    ref = offline.runner.forward_at(ids, 0, chunk_block=4).float()
    assert ((ours - ref).norm() / ref.norm()).item() < 5e-2
    out = {}
    for mode in MODES:
        llm.set_execution_mode(mode)
        r = llm.generate(prompt, max_new_tokens=24)
        out[mode] = (r.token_ids, r.denoise_steps, r.finish_reason)
    assert out["device_loop"] == out["host_loop"] == out["eager"], out


@pytest.mark.parametrize("quantization", ["fp8", "fp8:weight_only", "nvfp4", CT,
                                          f"{CT}:weight_only"])
def test_diffusion_gemma_quantised_modes_identical(made, quantization):
    """A quantised tiny DiffusionGemma on CUDA (the renoise decoder, `triton` attention and
    kernels; FP8 and compressed-tensors FP8 experts read as FP8 by the Triton MoE on sm_89+,
    a scale row per weight row): the three execution modes commit identical tokens, rounds
    and stops, for two seeds and two settings, over a prompt longer than the sliding
    window."""
    from dlrt.layers.moe.triton import TritonMoE, fp8_blocks

    quantization, _, mode = quantization.partition(":")
    llm = _llm(made(DG, quantization), **({"fp8_activations": mode} if mode else {}))
    assert llm.engine_config.decoder == "renoise"
    assert llm.engine_config.attention_backend == "triton"
    layers = llm.model.model.decoder.layers
    assert all(isinstance(layer.method, TritonMoE) for layer in layers)
    if quantization != "nvfp4":
        assert all(fp8_blocks(layer.experts) for layer in layers) == \
            (torch.cuda.get_device_capability() >= (8, 9))
    prompt = [2 + (7 * i + 11) % 8000 for i in range(37)]  # never the image id (1)
    for options in DG_OPTIONS:
        for seed in (0, 5):
            out = {}
            for m in MODES:
                llm.set_execution_mode(m)
                r = llm.generate(prompt, max_new_tokens=40, seed=seed, ignore_eos=True,
                                 **options)
                out[m] = (r.token_ids, r.denoise_steps, r.finish_reason)
            assert out["device_loop"] == out["host_loop"] == out["eager"], out
            assert len(out["eager"][0]) == 40 and len(out["eager"][1]) == 3


@pytest.mark.parametrize("quantization", ["fp8", CT])
def test_diffusion_gemma_online_equals_the_checkpoint_on_cuda(made, quantization):
    """On the device too, a tiny DiffusionGemma quantised while loading holds the bits of its
    written checkpoint (the stacked experts' rows quantised per expert and part) and commits
    the same tokens."""
    offline = _llm(made(DG, quantization))
    online = _llm(made(DG), quantization=quantization)
    a = dict(offline.model.named_parameters())
    b = dict(online.model.named_parameters())
    assert [n for n, p in a.items() if p.dtype == torch.float8_e4m3fn and "experts" in n]
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)
    prompt = [2 + (5 * i + 3) % 8000 for i in range(13)]
    assert offline.generate(prompt, max_new_tokens=24, seed=3).token_ids == \
        online.generate(prompt, max_new_tokens=24, seed=3).token_ids
