"""LLaDA-MoE (`LLaDAMoEModelLM`): the config reader, the family record, the model against a
transcription of the official forward (`lladamoe_reference.py`), generation with the canvas
decoder against LLaDA's `generate()` loop, and the Triton MoE with its router.

Logits: fp32 on the CPU, the tiny preset (3 layers: MoE, dense, MoE; 8 experts top 4; GQA)
made by make-checkpoint; the reference reads the same safetensors file by the official tensor
names, dlrt loads it through its loader. TOL is a relative Frobenius-norm error, ~100x the fp32
epsilon. Generation: the LM head sharpened x50 on both sides so confidences spread.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lladamoe_reference import forward as reference_forward
from lladamoe_reference import router as reference_router
from safetensors.torch import load_file

from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import PRESETS, real_config
from dlrt.errors import ConfigError
from dlrt.layers.moe.reference import ReferenceMoE
from dlrt.llm import LLM
from dlrt.models.registry import build_model, family_of, model_config
from dlrt.ops import reference

TOL = 1e-5
SHARPEN = 50.0
MASK = 156895
PROMPT = [5, 100, 2000, 30000, 156000, 7, 42, 9000, 77, 1234, 4321]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[LLM, dict, dict]:
    """(LLM, the checkpoint's tensors, its config.json) of tiny-llada-moe in fp32."""
    ckpt = make_checkpoint("tiny-llada-moe", tmp_path_factory.mktemp("lladamoe") / "ckpt",
                           dtype="float32")
    tensors = load_file(str(Path(ckpt) / "model.safetensors"))
    hf = json.loads((Path(ckpt) / "config.json").read_text())
    return LLM(ckpt, dtype="float32", device="cpu"), tensors, hf


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("n,seed", [(1, 0), (13, 1), (40, 2)])
def test_logits_match_the_official_forward(made, n, seed):
    llm, tensors, hf = made
    ids = torch.randint(0, hf["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        ours = llm.runner.forward_at(ids, 0, chunk_block=None)
        ref = reference_forward(tensors, hf, ids)
    assert ours.shape == ref.shape == (n, hf["vocab_size"])
    assert _rel(ours, ref) < TOL


def test_router_is_not_renormalised(made):
    """The top-4 softmax weights sum below 1 (the official block ignores norm_topk_prob), and
    dlrt's router picks the reference's experts with its weights."""
    llm, tensors, hf = made
    layer = llm.model.model.layers[0].mlp
    assert not layer.spec.renormalize and layer.spec.top_k == 4
    x = torch.randn(9, hf["hidden_size"], generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        weights, ids = ReferenceMoE().route(layer, x)
        ref_w, ref_ids = reference_router(x, tensors, "model.layers.0.mlp", hf)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=0, atol=1e-6)
    assert (weights.sum(-1) < 1 - 1e-3).all()


def test_norm_topk_prob_true_is_still_not_renormalised():
    hf = dict(PRESETS["tiny-llada-moe"], norm_topk_prob=True)
    assert model_config(hf).norm_topk_prob is False


def test_triton_moe_equals_the_reference_moe(made):
    """The Triton method (TRITON_INTERPRET=1 on the CPU) routes and applies the experts of a
    loaded LLaDA-MoE layer as the reference method does: the same ids, weights within 1e-6,
    outputs within 1e-5 of their scale; rows that take the GEMV and the grouped-GEMM forms."""
    pytest.importorskip("triton")
    from dlrt.layers.moe.triton import TritonMoE

    llm, _, hf = made
    layer = llm.model.model.layers[2].mlp
    for rows in (1, 5, 24):
        x = torch.randn(rows, hf["hidden_size"], generator=torch.Generator().manual_seed(rows))
        with torch.inference_mode():
            ref_w, ref_ids = ReferenceMoE().route(layer, x)
            w, ids = TritonMoE().route(layer, x)
            ref = ReferenceMoE().apply(layer, x, ref_w, ref_ids)
            out = TritonMoE().apply(layer, x, w, ids)
        assert torch.equal(ids, ref_ids), rows
        torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-6)
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-5, rows


def llada_generate(tensors: dict, hf: dict, prompt: list[int], steps: int, gen_length: int,
                   block_length: int) -> list[int]:
    """The official LLaDA / LLaDA-MoE `generate()` (low_confidence remasking, temperature 0,
    no CFG, batch of one) over the reference forward."""
    x = torch.full((1, len(prompt) + gen_length), MASK, dtype=torch.long)
    x[:, : len(prompt)] = torch.tensor(prompt)
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        start = len(prompt) + num_block * block_length
        end = start + block_length
        block_mask = x[:, start:end] == MASK
        mask_num = block_mask.sum(dim=1, keepdim=True)
        num_transfer = torch.zeros(1, steps, dtype=torch.int64) + mask_num // steps
        num_transfer[0, : int(mask_num[0, 0] % steps)] += 1
        for i in range(steps):
            mask_index = x == MASK
            logits = reference_forward(tensors, hf, x[0])[None]
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits.to(torch.float64), dim=-1)
            x0_p = torch.gather(p, -1, x0[..., None])[..., 0]
            x0_p[:, end:] = -math.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -math.inf)
            _, select = torch.topk(confidence[0], k=int(num_transfer[0, i]))
            x[0, select] = x0[0, select]
    return x[0, len(prompt):].tolist()


@pytest.mark.parametrize("p,gen,b,steps", [(5, 16, 8, 8), (11, 12, 4, 12), (3, 8, 8, 4)])
def test_generate_matches_the_official_loop(made, p, gen, b, steps):
    """LLM.generate with the family's default decoder (the canvas) equals `generate()`."""
    llm, tensors, hf = made
    assert type(llm.decoder).__name__ == "CanvasDecoder"
    tensors = dict(tensors, **{"lm_head.weight": tensors["lm_head.weight"] * SHARPEN})
    head = llm.model.lm_head.weight
    saved = head.detach().clone()
    try:
        with torch.no_grad():
            head.mul_(SHARPEN)
        with torch.inference_mode():
            want = llada_generate(tensors, hf, PROMPT[:p], steps, gen, b)
        got = llm.generate(PROMPT[:p], max_new_tokens=gen, block_length=b,
                           denoising_steps=steps // (gen // b), ignore_eos=True,
                           remasking_strategy="low_confidence_static")
    finally:
        with torch.no_grad():
            head.copy_(saved)
    assert got.token_ids == want
    assert len(set(want)) > 1


def test_family_record_and_registry():
    hf = PRESETS["tiny-llada-moe"]
    fam = family_of(hf)
    assert fam.name == "llada_moe" and fam.default_decoder == "canvas"
    assert fam.attention == "full"
    config = model_config(hf)
    assert config.mask_token_id == MASK and config.eos_token_ids == (156892,)
    assert config.moe_layers == (0, 2) and config.intermediate_size == 128
    assert config.moe_intermediate_size == 32 and config.head_dim == 16
    # the published file may share the dense model's model_type: the architecture decides
    assert family_of(dict(hf, model_type="llada")).name == "llada_moe"
    assert family_of({"model_type": "llada", "architectures": ["LLaDAModelLM"]}).name == "llada"
    assert family_of({"model_type": "llada"}).name == "llada"
    assert family_of({"architectures": ["LLaDAMoEModelLM"]}).name == "llada_moe"


def test_the_real_config_on_the_meta_device():
    """LLaDA-MoE-7B-A1B-Instruct: its geometry, ~7B parameters (~1.4B active), the official
    tensor names (what make-checkpoint writes and the loader reads)."""
    from dlrt.checkpoint.loader import weight_specs

    hf = json.loads((real_config("LLaDA-MoE-7B-A1B-Instruct") / "config.json").read_text())
    config = model_config(hf)
    assert (config.family, config.num_layers, config.hidden_size, config.num_heads) == \
        ("llada_moe", 16, 2048, 16)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == \
        (64, 8, 1024)
    assert config.moe_layers == tuple(range(16)) and config.rope_theta == 50000.0
    assert config.mask_token_id == MASK and config.eos_token_ids == (156892,)
    with torch.device("meta"):
        model = build_model(config, reference.OPS)
    total = sum(p.numel() for p in model.parameters())
    assert 7.0e9 < total < 7.5e9, total
    keys = {s.key for s in weight_specs(model, online=True)}
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                "model.layers.15.self_attn.q_proj.weight", "model.layers.0.self_attn.q_norm.weight",
                "model.layers.0.mlp.gate.weight", "model.layers.3.mlp.experts.63.down_proj.weight",
                "model.layers.0.post_attention_layernorm.weight"):
        assert key in keys, key


@pytest.mark.parametrize("change,named", [
    (dict(moe_router_score_function="sigmoid"), "moe_router_score_function"),
    (dict(shared_expert_intermediate_size=512), "shared_expert_intermediate_size"),
    (dict(moe_router_enable_expert_bias=True), "moe_router_enable_expert_bias"),
    (dict(qk_layernorm=False), "qk_layernorm"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling"),
    (dict(clip_qkv=8.0), "clip_qkv"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(moe_layer_freq=[1, 1]), "moe_layer_freq"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(hidden_size=66), "hidden_size"),
    (dict(expert_intermediate_size=None), "expert_intermediate_size"),
    (dict(dense_intermediate_size=0), "dense_intermediate_size"),
    (dict(mask_token_id=157184), "mask_token_id"),
])
def test_bad_configs_are_named(change, named):
    with pytest.raises(ConfigError, match=named):
        model_config(dict(PRESETS["tiny-llada-moe"], **change))
