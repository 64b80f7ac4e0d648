"""The soft-embedding kernel (`dlrt.kernels.soft_embedding`) against the reference op
`(softmax(x, fp32).to(E.dtype) @ E) * scale.to(E.dtype)` (DiffusionGemma's self-conditioning
input, with the model's casts), and DiffusionGemma's decoder fed by it.

Fresh random logits of several scales, fp32 and bf16 logits, row counts, vocabularies and
widths off every block, several vocabulary splits, -inf tokens (a whole split of them), a row
of -inf only (NaN, as the reference's softmax). Tolerances: fp32 E (the interpreter): the
relative Frobenius error < 1e-5 and every element within 1e-5 of the output's max; bf16 E
(GPU, the real shape: a 256-position canvas, V 262144, d 2816): against the product in fp64,
the kernel's relative error is at most the reference's own plus 1e-3 (both round to bf16;
~3e-3 each). The tiny DiffusionGemma model decodes a canvas with self-conditioning through the
`triton` ops table (this kernel, the GELU MoE kernels) as through the reference table (relative
Frobenius error of the logits < 1e-5, fp32). Iteration smoothing's paths (the canvas decoder
with and without its caches, the block decoder over SDAR and LLaDA2) hand the op the logits of
the rows they feed and the model's embedding matrix; the kernel matches the reference at each
of those row counts and widths (`SMOOTHING_SHAPES`; the vocabulary cut to 1500 tokens under the
interpreter). GPU: a captured graph's replay equals eager.
The sm_90 PTX of the real shape's layout (compiled on the CPU) multiplies on bf16 wgmma.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kernel_checks import body, compile_sm90, ptx_folder  # noqa: E402

from dlrt.kernels.soft_embedding import (  # noqa: E402
    SoftEmbeddingConfig,
    _split_kernel,
    soft_embedding,
    soft_embedding_config,
)
from dlrt.ops import get_ops, reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def check_fp32(x, w, scale=7.5, config=None):
    out = soft_embedding(x, w, scale, config)
    ref = reference.soft_embedding(x, w, scale)
    assert out.dtype == w.dtype and out.shape == ref.shape
    assert rel(out, ref) < 1e-5
    assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    return out


SPLITS = SoftEmbeddingConfig(block_m=16, block_d=16, block_v=32, splits=3)
CASES = [  # n, V, d, logit scale, config
    (5, 300, 48, 4.0, None),
    (3, 1000, 40, 1.0, SPLITS),  # three splits, d off the column block
    (17, 200, 16, 30.0, None),  # nearly one-hot rows
    (1, 64, 32, 2.0, None),
    (33, 257, 24, 3.0, SPLITS),  # three row tiles, the last split short
]


@pytest.mark.parametrize("n,v,d,scale,config", CASES)
def test_matches_reference(n, v, d, scale, config):
    gen = torch.Generator().manual_seed(n * v + d)
    x = (torch.randn(n, v, generator=gen) * scale).to(DEV)
    w = (torch.randn(v, d, generator=gen) * 0.5).to(DEV)
    check_fp32(x, w, config=config)
    check_fp32(x.bfloat16(), w, scale=torch.tensor(3.0), config=config)  # bf16 logits


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NaN arithmetic
def test_masked_tokens_and_a_masked_row():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 700, generator=gen) * 3
    w = torch.randn(700, 32, generator=gen)
    x[0, :400] = float("-inf")  # the first split and more: nothing there
    x[1, 1::2] = float("-inf")
    x[2, :] = float("-inf")  # no token at all: NaN, as the reference's softmax
    cfg = SoftEmbeddingConfig(block_m=16, block_d=16, block_v=64, splits=3)
    out = soft_embedding(x.to(DEV), w.to(DEV), 1.0, cfg).cpu()
    ref = reference.soft_embedding(x, w)
    keep = [0, 1, 3]
    assert rel(out[keep], ref[keep]) < 1e-5
    assert out[2].isnan().all() and ref[2].isnan().all()


def test_config_and_bad_arguments():
    cfg = soft_embedding_config(256, 262144, 2816)
    assert (cfg.block_m, cfg.block_d) == (128, 128)
    assert cfg.splits * 2 * 22 >= 264  # enough programs to fill the GPU
    assert soft_embedding_config(1, 64, 16).splits == 1
    x = torch.zeros(2, 64, device=DEV)
    with pytest.raises(ValueError, match="contiguous x"):
        soft_embedding(x, torch.zeros(63, 8, device=DEV))
    with pytest.raises(ValueError, match="contiguous x"):
        soft_embedding(x.t(), torch.zeros(2, 8, device=DEV))
    assert soft_embedding(x[:0], torch.zeros(64, 8, device=DEV)).shape == (0, 8)


def _tiny_model(path, ops):
    from dlrt.checkpoint.folder import CheckpointFolder
    from dlrt.checkpoint.loader import load_safetensors, materialize
    from dlrt.models.registry import build_model, model_config

    config = model_config(json.loads((path / "config.json").read_text()))
    with torch.device("meta"):
        model = build_model(config, ops)
    materialize(model, torch.float32, torch.device(DEV))
    load_safetensors(model, CheckpointFolder.open(path))
    return model.eval()


def test_the_model_takes_the_op(tmp_path):
    """DiffusionGemma's decoder with self-conditioning: the `triton` table (soft embeddings
    and GELU experts from the kernels) computes the reference table's logits; the decoder
    hands the op its logits, E and the embedding scale."""
    from dlrt.attention.kv_cache import PagedKVCache
    from dlrt.attention.sdpa import SDPABackend
    from dlrt.checkpoint.make import make_checkpoint
    from dlrt.runtime.runner import ModelRunner

    path = make_checkpoint("tiny-diffusion-gemma", tmp_path / "ckpt", dtype="float32", seed=1)
    calls = []

    def spy(logits, weight, scale):
        calls.append((logits, weight, scale))
        return reference.soft_embedding(logits, weight, scale)

    tables = {"reference": dataclasses.replace(reference.OPS, soft_embedding=spy),
              "triton": get_ops("triton")}
    gen = torch.Generator().manual_seed(0)
    logits = {}
    for name, ops in tables.items():
        model = _tiny_model(path, ops)
        c = model.config
        if name == "reference":
            prompt = torch.randint(0, c.vocab_size, (5,), generator=gen).to(DEV)
            canvas = torch.randint(0, c.vocab_size, (c.canvas_length,), generator=gen).to(DEV)
            signal = (torch.randn(c.canvas_length, c.vocab_size, generator=gen) * 3).to(DEV)
        cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, 64, torch.float32,
                             torch.device(DEV), layer_shapes=c.kv_shapes())
        runner = ModelRunner(model, ops, SDPABackend(cache, c.num_heads), cache,
                             torch.device(DEV))
        with torch.no_grad():
            runner.forward(prompt, runner.lens(0, 5), 1)
            logits[name] = runner.forward(canvas, runner.lens(5, 5 + c.canvas_length), None,
                                          rows=slice(None), self_conditioning=signal)
        if name == "reference":
            (got, weight, scale), = calls
            assert got is signal and weight is model.model.decoder.embed_tokens.weight
            assert scale == c.embed_scale
    assert rel(logits["triton"], logits["reference"]) < 1e-5


# (rows, width) iteration smoothing hands the op on the tiny models of `_smoothing_calls`: a
# block of 4 (SDAR) and 32 (LLaDA2), a canvas of 64 slots, a dual window from its sub-block
# (8, and 8 + 3 after it), a prefix window (3 sub-blocks of 8)
SMOOTHING_SHAPES = [(4, 64), (32, 64), (64, 64), (8, 64), (11, 64), (24, 64)]


@pytest.mark.parametrize("n,d", SMOOTHING_SHAPES)
def test_smoothing_shapes(n, d):
    gen = torch.Generator().manual_seed(n)
    x = (torch.randn(n, 1500, generator=gen) * 8).to(DEV)  # sharp rows, as a sharpened head
    w = (torch.randn(1500, d, generator=gen) * 0.02).to(DEV)
    check_fp32(x, w, scale=1.0)


def _smoothing_calls(path, monkeypatch, **options) -> tuple[list, object]:
    """(the (rows, V, width) of each soft_embedding call, whether every call got the model's
    embedding matrix) of one smoothed request (reference ops on the CPU)."""
    from dlrt import LLM
    from dlrt.runtime.smoothing import input_embedding

    calls = []

    def spy(logits, weight, scale=1.0):
        calls.append((tuple(logits.shape), weight.shape[1], weight))
        return reference.soft_embedding(logits, weight, scale)

    monkeypatch.setattr(reference, "OPS", dataclasses.replace(reference.OPS, soft_embedding=spy))
    llm = LLM(path, dtype="float32", device="cpu")
    llm.generate([5, 6, 7, 8, 9], 24, temperature=0.0, ignore_eos=True, smoothing=True,
                 remasking_strategy="threshold", threshold=0.9, **options)
    embed = input_embedding(llm.model)
    assert calls and all(weight is embed for _, _, weight in calls)
    return [(n, v, d) for (n, v), d, _ in calls], llm.config.vocab_size


@pytest.mark.parametrize("preset,options,rows", [
    ("tiny_sdar", dict(block_length=4), {4}),
    ("tiny_llada2", dict(block_length=32), {32}),
    ("tiny_llada", dict(block_length=8), {64}),
    ("tiny_llada", dict(block_length=8, canvas_cache="prefix"), {64, 24}),
    ("tiny_llada", dict(block_length=8, canvas_cache="dual"), {64, 8}),
    ("tiny_llada", dict(block_length=8, canvas_cache="dual", vicinity_before=2,
                        vicinity_after=3), {64, 11}),
])
def test_the_smoothing_paths_use_the_op(preset, options, rows, request, monkeypatch):
    """Each smoothing path's soft embeddings come from the ops table's `soft_embedding` (the
    kernel on CUDA) with the model's embedding matrix, at shapes the interpreter test covers:
    the block's rows, the canvas's slots, a cached window's rows from its sub-block on."""
    calls, vocab = _smoothing_calls(request.getfixturevalue(preset), monkeypatch, **options)
    assert {n for n, _, _ in calls} == rows
    assert all(v == vocab for _, v, _ in calls)
    assert {(n, d) for n, _, d in calls} <= set(SMOOTHING_SHAPES)


REAL = (256, 262144, 2816)  # canvas, DiffusionGemma's vocabulary and hidden size


def real_inputs(seed: int):
    n, v, d = REAL
    gen = torch.Generator(DEV).manual_seed(seed)
    x = (30 * torch.tanh(torch.randn(n, v, device=DEV, generator=gen) * 0.2) / 0.4)
    w = (torch.randn(v, d, device=DEV, generator=gen) * 0.02).bfloat16()
    return x.bfloat16(), w  # the self-conditioning buffer holds the model dtype


@pytest.mark.gpu
def test_real_shape_gpu():
    x, w = real_inputs(0)
    scale = REAL[2] ** 0.5
    out = soft_embedding(x, w, scale)
    ref = reference.soft_embedding(x, w, scale)
    exact = (torch.softmax(x.double(), dim=-1) @ w.double()) * float(torch.tensor(scale)
                                                                      .bfloat16())
    err, ref_err = rel(out, exact), rel(ref, exact)
    print(f"relative error vs fp64: kernel {err:.2e}, reference {ref_err:.2e}")
    assert err <= ref_err + 1e-3, (err, ref_err)


@pytest.mark.gpu
def test_graph_replay_matches_eager_gpu():
    x, w = real_inputs(1)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        soft_embedding(x, w, 53.0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = soft_embedding(x, w, 53.0)
    for seed in range(2):
        x.copy_(real_inputs(10 + seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, soft_embedding(x, w, 53.0))


def _compile(out: Path) -> None:
    cfg = soft_embedding_config(*REAL)
    sig = dict(x_ptr="*bf16", w_ptr="*bf16", part_ptr="*fp32", stat_ptr="*fp32", N="i32",
               V="i32", D="i32", V_SPLIT="i32")
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_D=cfg.block_d, BLOCK_V=cfg.block_v,
                  PRECISION="tf32", PDL=True)
    (out / "split.ptx").write_text(compile_sm90(_split_kernel, sig, consts,
                                                num_warps=cfg.warps, num_stages=cfg.stages))


def test_sm90_multiplies_on_tensor_cores(tmp_path_factory):
    """The real shape's layout: exp(x - m) times E on Hopper's bf16 wgmma (fp32 sums)."""
    ptx = body((ptx_folder(tmp_path_factory, __file__, "softembptx") / "split.ptx")
               .read_text())
    mma = [ln for ln in ptx if ln.startswith("wgmma.mma_async")]
    assert mma and all(".f32.bf16.bf16" in ln for ln in mma), mma[:2]


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
