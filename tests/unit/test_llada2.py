"""The LLaDA2 MoE family: its config normaliser, its forward against an independent reference of
the official semantics (`llada2_reference.py`), loading defaults, and generation on the CPU.

Parity: fp32 weights (the tiny-llada2 preset: layer 0 dense, layers 1-2 MoE with 8 experts in
4 groups, top-2 of the best 2 groups, a shared expert, RoPE on 16 of 32 head dims), token ids
at positions 0..N-1, a block-causal mask. TOL is the relative Frobenius-norm error of the
logits, ~100x the fp32 epsilon (as the SDAR parity tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from llada2_reference import forward as reference_forward
from safetensors.torch import load_file

from dlrt import LLM, ConfigError
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import PRESETS
from dlrt.decoding.options import DecoderDefaults
from dlrt.models.registry import family, model_config

TOL = 1e-5
MASK, EOS = 156895, 156892
REAL = Path(__file__).resolve().parents[2] / "dlrt" / "data" / "configs" / "LLaDA2.0-mini"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_checkpoint("tiny-llada2", tmp_path_factory.mktemp("llada2") / "ckpt",
                           dtype="float32")


@pytest.fixture(scope="module")
def tensors(tiny) -> dict[str, torch.Tensor]:
    return load_file(str(tiny / "model.safetensors"))


@pytest.fixture(scope="module")
def hf(tiny) -> dict:
    return json.loads((tiny / "config.json").read_text())


@pytest.fixture(scope="module")
def llm(tiny) -> LLM:
    return LLM(tiny, dtype="float32", device="cpu")


def _view(src: Path, dst: Path, config: dict, generation: bool = True) -> Path:
    """The checkpoint's weights under another config.json."""
    dst.mkdir(parents=True)
    os.symlink(src / "model.safetensors", dst / "model.safetensors")
    if generation:
        os.symlink(src / "generation_config.json", dst / "generation_config.json")
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm()).item()


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 157184, (n,), generator=torch.Generator().manual_seed(seed))


def block_causal(n: int, b: int) -> torch.Tensor:
    i = torch.arange(n)
    return (i[None, :] // b) <= (i[:, None] // b)


# --- config ------------------------------------------------------------------------------------


def test_real_config_normalised():
    c = model_config(json.loads((REAL / "config.json").read_text()))
    assert c.family == "llada2" and c.num_layers == 20 and c.head_dim == 128
    assert c.rotary_dim == 64 and c.rope_theta == 600000.0 and c.use_qk_norm
    assert c.moe_layers == tuple(range(1, 20)) and c.num_experts == 256
    assert (c.num_experts_per_tok, c.n_group, c.topk_group) == (8, 8, 4)
    assert c.routed_scaling_factor == 2.5 and c.num_shared_experts == 1
    assert c.router_scoring == "sigmoid" and c.moe_intermediate_size == 512
    assert c.mask_token_id == MASK and c.eos_token_ids == (EOS,)  # the family's defaults
    rec = family("llada2")
    assert rec.default_decoder == "block" and rec.attention == "block_causal"
    assert rec.supports_editing and rec.tokenizer is None
    assert rec.decoder_defaults == DecoderDefaults(32, "threshold", 0.95)
    assert rec.embedding == "model.word_embeddings.weight"


@pytest.mark.parametrize("changes,words", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"use_qkv_bias": True}, "use_qkv_bias"),
    ({"use_bias": True}, "use_bias"),
    ({"use_bias": None}, "use_bias"),  # absent: LLaDA2MoeConfig's default is a bias
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"score_function": "softmax"}, "score_function"),
    ({"moe_router_enable_expert_bias": False}, "expert_bias"),
    ({"rotary_dim": 8}, "rotary_dim"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"partial_rotary_factor": 0.01}, "partial_rotary_factor"),
    ({"n_group": 3}, "n_group"),
    ({"topk_group": 5}, "topk_group"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),  # > 2 groups of 2
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ({"mask_token_id": 157184}, "mask_token_id"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_experts": ...}, "num_experts"),  # absent (null means every layer dense)
])
def test_bad_configs_name_the_field(changes, words):
    hf = dict(PRESETS["tiny-llada2"])
    for k, v in changes.items():
        if v is None or v is ...:
            hf.pop(k)
        else:
            hf[k] = v
    with pytest.raises(ConfigError, match=words):
        model_config(hf)


def test_config_variants():
    base = dict(PRESETS["tiny-llada2"])
    c = model_config({**base, "partial_rotary_factor": 1.0, "rotary_dim": None})
    assert c.rotary_dim == 32  # full rotation
    c = model_config({k: v for k, v in base.items() if k not in ("partial_rotary_factor",
                                                                   "rotary_dim")})
    assert c.rotary_dim == 16  # LLaDA2MoeConfig's default factor 0.5
    assert model_config({**base, "num_experts": None}).moe_layers == ()
    assert model_config({**base, "first_k_dense_replace": 0}).moe_layers == (0, 1, 2)
    small = {**base, "vocab_size": 1000}
    small.pop("mask_token_id"), small.pop("eos_token_id")
    c = model_config(small)  # the defaults do not fit: none
    assert c.mask_token_id is None and c.eos_token_ids == ()


# --- forward parity ----------------------------------------------------------------------------


@pytest.mark.parametrize("b,n", [(4, 13), (8, 13), (4, 3), (32, 13), (4, 21)])
def test_forward_matches_reference(llm, tensors, hf, b, n):
    """Block-causal logits equal the reference's. (n=3, 13: <= 32 (token, expert) pairs take
    the gathered-expert path; n=21 the per-expert loop.)"""
    ids = _ids(n)
    ours = llm.runner.forward_at(ids, 0, chunk_block=b)
    ref = reference_forward(tensors, hf, ids, block_causal(n, b))
    assert ours.shape == ref.shape == (n, 157184)
    assert _rel(ours, ref) < TOL
    if n > b:  # the mask matters
        assert _rel(reference_forward(tensors, hf, ids, torch.ones(n, n).bool()), ref) > 1e-3


@pytest.mark.parametrize("b,first,second", [(4, 8, 12), (8, 8, 16)])
def test_cached_blocks_match_reference(llm, tensors, hf, b, first, second):
    """Prefill whole blocks into the paged cache in two chunks (the second crossing the 16-token
    page), then one block against the cache: each chunk's logits equal the same rows of the
    reference's block-causal forward of the whole sequence."""
    run = llm.runner
    ids = _ids(first + second + b, seed=2)
    ref = reference_forward(tensors, hf, ids, block_causal(len(ids), b))
    run.forward_at(torch.roll(ids, 3), 0, chunk_block=b)  # stale K/V everywhere first
    head = run.forward_at(ids[:first], 0, chunk_block=b)
    mid = run.forward_at(ids[first:first + second], first, chunk_block=b)
    last = run.forward_at(ids[first + second:], first + second, chunk_block=b)
    assert _rel(head, ref[:first]) < TOL
    assert _rel(mid, ref[first:first + second]) < TOL
    assert _rel(last, ref[first + second:]) < TOL


def test_expert_bias_and_groups_are_used(llm, tensors, hf):
    """The router's inputs matter: a zero expert bias, or all groups kept, change the logits
    (of dlrt and of the reference alike)."""
    ids, b = _ids(13, seed=4), 4
    base = llm.runner.forward_at(ids, 0, chunk_block=b)
    bias = llm.model.model.layers[1].mlp.gate.expert_bias
    assert bias.dtype == torch.float32 and bias.std() > 0
    kept = bias.detach().clone()
    try:
        bias.data.zero_()
        unbiased = llm.runner.forward_at(ids, 0, chunk_block=b)
    finally:
        bias.data.copy_(kept)
    assert _rel(unbiased, base) > 1e-3
    zero = dict(tensors, **{"model.layers.1.mlp.gate.expert_bias": torch.zeros(8)})
    assert _rel(unbiased, reference_forward(zero, hf, ids, block_causal(13, b))) < TOL
    all_groups = reference_forward(tensors, {**hf, "topk_group": 4}, ids, block_causal(13, b))
    assert _rel(all_groups, base) > 1e-3


def test_without_qk_norm(tiny, tensors, hf, tmp_path):
    """use_qk_norm: false builds no query/key_layernorm (their tensors are ignored)."""
    cfg = {**hf, "use_qk_norm": False}
    ours = LLM(_view(tiny, tmp_path / "v", cfg), dtype="float32", device="cpu")
    assert ours.model.model.layers[0].attention.query_layernorm is None
    # norms of ones change nothing: scale them so the check sees the difference
    qk_norms = ("query_layernorm.weight", "key_layernorm.weight")
    scaled = {k: (v * 1.5 if k.endswith(qk_norms) else v) for k, v in tensors.items()}
    ids = _ids(9, seed=5)
    got = ours.runner.forward_at(ids, 0, chunk_block=4)
    assert _rel(got, reference_forward(scaled, cfg, ids, block_causal(9, 4))) < TOL
    assert _rel(got, reference_forward(scaled, hf, ids, block_causal(9, 4))) > 1e-3


def test_triton_ops_match_reference(tiny, tensors, hf):
    """The Triton ops table (CUDA, or the interpreter on the CPU): partial RoPE in the fused
    q/k norm + RoPE + cache-write kernel, the MoE method of the table."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ours = LLM(tiny, dtype="float32", device=device, kernels="triton", max_model_len=64)
    assert ours.engine.ops.name == "triton"
    ids = _ids(10, seed=6)
    got = ours.runner.forward_at(ids.to(device), 0, chunk_block=4).cpu()
    assert _rel(got, reference_forward(tensors, hf, ids, block_causal(10, 4))) < TOL


# --- checkpoints and loading -------------------------------------------------------------------


def test_router_params_stay_fp32(tmp_path):
    """make-checkpoint writes expert_bias in fp32 (as the official checkpoint) and the gate
    weight in the dtype; a bf16 model keeps both router params in fp32."""
    out = make_checkpoint("tiny-llada2", tmp_path / "bf16", num_layers=2)
    t = load_file(str(out / "model.safetensors"))
    assert t["model.layers.1.mlp.gate.expert_bias"].dtype == torch.float32
    assert t["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16
    assert t["model.layers.1.input_layernorm.weight"].dtype == torch.bfloat16
    p = dict(LLM(out, dtype="bfloat16", device="cpu").model.named_parameters())
    assert p["model.layers.1.mlp.gate.expert_bias"].dtype == torch.float32
    assert p["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    assert p["model.layers.1.mlp.experts.w13"].dtype == torch.bfloat16
    assert torch.equal(p["model.layers.1.mlp.gate.expert_bias"],
                       t["model.layers.1.mlp.gate.expert_bias"])


def test_dummy_weights_equal_made_ones(tiny, tensors):
    """load_format=dummy reproduces the made checkpoint; norms are ones, router biases are
    not uniform."""
    p = dict(LLM(tiny, dtype="float32", device="cpu", load_format="dummy",
                 seed=0).model.named_parameters())
    bias = tensors["model.layers.2.mlp.gate.expert_bias"]
    assert torch.equal(p["model.layers.2.mlp.gate.expert_bias"], bias)
    assert bias.unique().numel() == 8
    assert torch.equal(p["model.layers.0.attention.dense.weight"],
                       tensors["model.layers.0.attention.dense.weight"])
    assert torch.equal(tensors["model.layers.2.attention.key_layernorm.weight"], torch.ones(32))


def test_folder_without_tokenizer_or_ids_uses_family_defaults(tiny, hf, tmp_path):
    cfg = {k: v for k, v in hf.items() if k not in ("mask_token_id", "eos_token_id",
                                                    "pad_token_id")}
    ours = LLM(_view(tiny, tmp_path / "v", cfg, generation=False), dtype="float32",
               device="cpu")
    assert ours.tokenizer is None
    assert ours.config.mask_token_id == MASK
    assert ours.eos_token_ids == (EOS,)


# --- generation --------------------------------------------------------------------------------


@pytest.mark.parametrize("b,max_new", [(32, 40), (4, 10)])
def test_generate_end_to_end(llm, b, max_new):
    prompt = [5, 100, 2000, 30000, 156000, 7]
    r = llm.generate(prompt, max_new, block_length=b, temperature=0.0, ignore_eos=True)
    assert len(r.token_ids) == max_new and r.prompt_token_ids == prompt
    assert all(0 <= t < 157184 and t != MASK for t in r.token_ids)
    assert r.finish_reason == "length"
    again = llm.generate(prompt, max_new, block_length=b, temperature=0.0, ignore_eos=True)
    assert again.token_ids == r.token_ids  # greedy is deterministic


def test_cli_generate_without_tokenizer_prints_the_ids(tiny_llada2, capsys):
    """No tokenizer, no text: `dlrt generate` prints each block's ids on a line."""
    from dlrt.entrypoints.cli import main

    argv = ["generate", "--model", str(tiny_llada2), "--prompt-ids", "1,2,3",
            "--max-new-tokens", "40", "--temperature", "0", "--ignore-eos"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.split("\n")
    ids = [int(t) for line in lines for t in line.split()]
    assert len(ids) == 40 and len([line for line in lines if line]) == 2  # blocks of 32
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == ids
