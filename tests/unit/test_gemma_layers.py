"""The layer parts DiffusionGemma brings: Gemma's fp32 RMSNorm and proportional RoPE (bit for
bit against transformers'), gated MLPs and experts of another activation than SiLU, experts
stored stacked in the checkpoint and quantised (held as the others, read per expert and part
from a quantised checkpoint, made from the stacked tensors' rows online), and what is refused
for them (the Triton MoE kernels)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dlrt.checkpoint.loader import weight_specs
from dlrt.layers.mlp import GatedMLP
from dlrt.layers.moe import StackedExperts, moe_method
from dlrt.layers.moe.reference import ReferenceMoE
from dlrt.layers.moe.triton import TritonMoE
from dlrt.layers.norm import Fp32RMSNorm, RMSNorm
from dlrt.layers.quant.convert import quantize_module
from dlrt.layers.quant.registry import get_format
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.ops import reference


def test_fp32_rmsnorm_is_gemmas():
    modeling = pytest.importorskip("transformers.models.diffusion_gemma.modeling_diffusion_gemma")
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 64, generator=g) * 3).bfloat16()
    w = (1 + torch.randn(64, generator=g) * 0.3).bfloat16()
    for weight in (True, False):
        ref = modeling.DiffusionGemmaRMSNorm(64, eps=1e-6, with_scale=weight).bfloat16()
        ours = Fp32RMSNorm(64, 1e-6, weight=weight).bfloat16()
        if weight:
            ref.weight.data.copy_(w)
            ours.weight.data.copy_(w)
        with torch.no_grad():
            assert torch.equal(ours(x), ref(x))
    # NOTE: not dlrt's RMSNorm, which casts to bf16 before the weight multiply
    qwen = RMSNorm(64, 1e-6, reference.OPS).bfloat16()
    qwen.weight.data.copy_(w)
    assert not torch.equal(qwen(x), ours(x))


@pytest.mark.parametrize("head_dim,factor", [(512, 0.25), (32, 0.25), (64, 0.5), (16, 1.0)])
def test_proportional_rope_is_transformers(head_dim, factor):
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    if "proportional" not in rope_utils.ROPE_INIT_FUNCTIONS:
        pytest.skip("this transformers has no proportional RoPE (the test extra pins it)")
    config = SimpleNamespace(
        head_dim=head_dim, hidden_size=4 * head_dim, num_attention_heads=4,
        rope_parameters={"rope_type": "proportional", "rope_theta": 1e6,
                         "partial_rotary_factor": factor},
        standardize_rope_params=lambda: None)
    want, _ = rope_utils.ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    ours = RotaryEmbedding(head_dim, 1e6, pairs=int(factor * head_dim // 2))
    assert torch.equal(ours.inv_freq, want)
    # the still pairs pass through: cos 1, sin 0
    x = torch.randn(3, 2, head_dim)
    cos, sin = ours.cos_sin(torch.tensor([0, 7, 1000]))
    y = ours.rotate(x, cos, sin)
    still = [i for i in range(head_dim // 2) if ours.inv_freq[i] == 0]
    cols = still + [i + head_dim // 2 for i in still]
    assert torch.equal(y[..., cols], x[..., cols])


def test_rope_pairs_need_the_whole_head():
    with pytest.raises(ValueError, match="without rotary_dim"):
        RotaryEmbedding(32, 1e4, rotary_dim=16, pairs=4)
    with pytest.raises(ValueError, match=r"\[0, head_dim / 2 = 16\]"):
        RotaryEmbedding(32, 1e4, pairs=17)


def _gelu_mul(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def test_gated_mlp_and_gelu_experts():
    g = torch.Generator().manual_seed(1)
    mlp = GatedMLP(8, 6, "gelu_pytorch_tanh")
    mlp.gate_up_proj.weight.data.normal_(generator=g)
    mlp.down_proj.weight.data.normal_(generator=g)
    x = torch.randn(4, 8, generator=g)
    w = mlp.gate_up_proj.weight
    want = _gelu_mul(x @ w[:6].T, x @ w[6:].T) @ mlp.down_proj.weight.T
    assert torch.allclose(mlp(x), want, atol=1e-5)
    with pytest.raises(ValueError, match="activation 'relu'"):
        GatedMLP(8, 6, "relu")
    experts = StackedExperts(3, 8, 6, activation="gelu_pytorch_tanh", stacked=True)
    experts.w13.data.normal_(generator=g)
    experts.w2.data.normal_(generator=g)
    layer = SimpleNamespace(experts=experts)
    ids = torch.tensor([[0, 2], [1, 0], [2, 1], [1, 2]])
    weights = torch.rand(4, 2, generator=g)
    want = torch.zeros(4, 8)
    for n, j in ((n, j) for n in range(4) for j in range(2)):
        e = ids[n, j]
        gu = experts.w13[e] @ x[n]
        want[n] += weights[n, j] * (experts.w2[e] @ _gelu_mul(gu[:6], gu[6:]))
    method = ReferenceMoE()
    assert torch.allclose(method.apply(layer, x, weights, ids), want, atol=1e-5)
    method.GATHER_PAIRS_PER_EXPERT = 0  # the loop over chosen experts
    assert torch.allclose(method.apply(layer, x, weights, ids), want, atol=1e-5)


def test_gelu_experts_take_the_triton_method():
    """The Triton kernels compute SiLU and gelu_pytorch_tanh experts (tested against the
    reference in tests/kernels/test_moe_gemma.py); another activation takes the reference."""
    triton_ops = SimpleNamespace(name="triton")
    assert isinstance(moe_method(triton_ops, "gelu_pytorch_tanh"), TritonMoE)
    assert isinstance(moe_method(triton_ops), TritonMoE)
    assert isinstance(moe_method(triton_ops, "relu"), ReferenceMoE)
    assert isinstance(moe_method(reference.OPS, "gelu_pytorch_tanh"), ReferenceMoE)
    layer = SimpleNamespace(experts=StackedExperts(2, 8, 4, activation="relu"))
    with pytest.raises(ValueError, match="not 'relu'"):
        TritonMoE().apply(layer, torch.zeros(1, 8), torch.ones(1, 1),
                          torch.zeros(1, 1, dtype=torch.long))


class _Layer(torch.nn.Module):
    def __init__(self, stacked: bool):
        super().__init__()
        with torch.device("meta"):
            self.experts = StackedExperts(4, 8, 6, stacked=stacked)


def test_stacked_experts_read_one_tensor_each():
    specs = {s.param: s for s in weight_specs(_Layer(stacked=True))}
    assert (specs["experts.w13"].key, specs["experts.w13"].shape) == \
        ("experts.gate_up_proj", (4, 12, 8))
    assert (specs["experts.w2"].key, specs["experts.w2"].index) == ("experts.down_proj", None)
    per_expert = [s.key for s in weight_specs(_Layer(stacked=False))]
    assert "experts.3.up_proj.weight" in per_expert and len(per_expert) == 12


def test_stacked_experts_are_quantised_as_the_others():
    """Quantised, stacked experts hold what per-expert ones hold; a quantised checkpoint is read
    one tensor per expert and part (the published layout), and online quantisation makes those
    tensors from the expert's rows of the stacked tensors."""
    layers = {}
    for stacked in (True, False):
        layers[stacked] = _Layer(stacked=stacked)
        quantize_module(layers[stacked].experts, get_format("fp8"))
    held = [{n: (p.shape, p.dtype) for n, p in layers[s].named_parameters()} for s in layers]
    assert held[0] == held[1] and "experts.w13_weight_scale_inv" in held[0]
    offline = [(s.key, s.index) for s in weight_specs(layers[True])]
    assert offline == [(s.key, s.index) for s in weight_specs(layers[False])]
    assert ("experts.3.up_proj.weight_scale_inv", (3, slice(6, 12))) in offline
    online = {s.key: s for s in weight_specs(layers[True], online=True)}
    up = online["experts.3.up_proj.weight"]
    assert (up.source, up.source_shape, up.source_index) == \
        ("experts.gate_up_proj", (4, 12, 8), (3, slice(6, 12)))
    down = online["experts.1.down_proj.weight_scale_inv"]
    assert (down.source, down.source_shape, down.source_index) == \
        ("experts.down_proj", (4, 8, 6), (1, slice(0, 8)))
