"""One DiffusionGemma layer (transformers' `DiffusionGemmaDecoderTextLayer`, the same weights as
the encoder's `DiffusionGemmaEncoderTextLayer`): attention, then a dense MLP and routed experts
side by side.

    x = x + post_attention_layernorm(attn(input_layernorm(x)))
    dense = post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(x)))
    routed = post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(x), router(x)))
    x = (x + post_feedforward_layernorm(dense + routed)) * layer_scalar

Every norm is `Fp32RMSNorm` (Gemma's: weight multiplied in fp32). The encoder and the decoder
each bring their own layer scalar (the only weight they do not share). Module names equal the
checkpoint keys under `model.decoder.layers.{i}.` (merged projections: `dlrt.checkpoint.loader`).
"""

from __future__ import annotations

import torch
from torch import nn

from dlrt.attention.base import ForwardContext
from dlrt.layers.attention import Attention
from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.mlp import GatedMLP
from dlrt.layers.moe import StackedExperts, moe_method
from dlrt.layers.moe.base import MoEMethod, RouterSpec
from dlrt.layers.norm import Fp32RMSNorm
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.models.config import ModelConfig
from dlrt.ops import Ops


class DiffusionGemmaAttention(nn.Module):
    """x [N, H] -> [N, H] for layer `layer_id` (its head size, KV heads and window from the
    config: sliding or full attention).

    q = RoPE(q_norm(q_proj x)), k = RoPE(k_norm(k_proj x)), v = v_norm(v_proj x), where a
    full-attention layer with K = V has no v_proj and v = v_norm(k_proj x) (k before its norm
    and RoPE); q_norm / k_norm are weighted per-head RMSNorms, v_norm has no weight. Attention
    scale 1.0 (`ModelConfig.attention_scale`), then o_proj. A causal chunk (the encoder) writes
    k and v into the cache; a full one (the decoder) writes nothing: its k and v reach the
    backend beside the cache (`Attention.attend`).
    """

    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        d, kv = c.layer_head_dim(layer_id), c.layer_kv_heads(layer_id)
        self.k_eq_v = c.attention_k_eq_v and not c.is_sliding(layer_id)
        parts = {"q_proj": c.num_heads * d, "k_proj": kv * d}
        if not self.k_eq_v:
            parts["v_proj"] = kv * d
        self.qkv_proj = MergedLinear(c.hidden_size, parts)
        self.o_proj = Linear(c.num_heads * d, c.hidden_size)
        self.q_norm = Fp32RMSNorm(d, c.rms_norm_eps)
        self.k_norm = Fp32RMSNorm(d, c.rms_norm_eps)
        self.v_norm = Fp32RMSNorm(d, c.rms_norm_eps, weight=False)
        self.attn = Attention(layer_id, c.num_heads, kv, d, ops, scale=c.attention_scale,
                              window=c.layer_window(layer_id))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                rotary: RotaryEmbedding, ctx: ForwardContext) -> torch.Tensor:
        n, a = x.shape[0], self.attn
        qkv = self.qkv_proj(x)  # [N, (Hq + Hkv (+ Hkv)) D]
        q, k, *v = qkv.split([size for _, size in self.qkv_proj.parts], dim=-1)
        q = q.view(n, a.num_heads, a.head_dim)
        k = k.view(n, a.num_kv_heads, a.head_dim)
        v = k if self.k_eq_v else v[0].view(n, a.num_kv_heads, a.head_dim)
        q = rotary.rotate(self.q_norm(q), *rope)
        k, v = rotary.rotate(self.k_norm(k), *rope), self.v_norm(v)
        encoder = ctx.meta.chunk_block is not None
        return self.o_proj(a.attend(q, k, v, ctx, write=encoder))


class DiffusionGemmaRouter(nn.Module):
    """(x [N, H], the layer's MoE method) -> (weights [N, k] fp32, expert ids [N, k] int64).

    logits = proj(norm(x) * scale * H ** -0.5) in x's dtype (`norm` without weight), softmax in
    fp32 over the E experts, top-k (ties to the lower id), renormalised to sum 1, each weight
    times its expert's `per_expert_scale` (the rule after the logits: `method.select`).
    Checkpoint: `router.proj.weight` [E, H], `router.scale` [H], `router.per_expert_scale` [E].
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.spec = RouterSpec("softmax", c.num_experts, c.num_experts_per_tok)
        self.norm = Fp32RMSNorm(c.hidden_size, c.rms_norm_eps, weight=False)
        self.proj = Linear(c.hidden_size, c.num_experts)
        self.scale = nn.Parameter(torch.ones(c.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(c.num_experts))
        self.root_size = c.hidden_size**-0.5

    def forward(self, x: torch.Tensor, method: MoEMethod) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.proj(self.norm(x) * self.scale * self.root_size)  # [N, E]
        return method.select(self.spec, logits, expert_scale=self.per_expert_scale)


class DiffusionGemmaLayer(nn.Module):
    """One layer (see the module docstring); forward(x [N, H], rope, rotary, ctx, layer_scalar
    [1]) -> [N, H]. The routing rule and the routed experts are computed by the ops table's
    MoE method (`moe_method`: the Triton kernels with the `triton` ops)."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        self.self_attn = DiffusionGemmaAttention(c, layer_id, ops)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_act)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1",
                     "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
            setattr(self, name, Fp32RMSNorm(c.hidden_size, c.rms_norm_eps))
        self.router = DiffusionGemmaRouter(c)
        self.experts = StackedExperts(c.num_experts, c.hidden_size, c.moe_intermediate_size,
                                      activation=c.hidden_act, stacked=True)
        self.method = moe_method(ops, c.hidden_act)
        self.layer_scalar = nn.Parameter(torch.ones(1))  # the decoder's

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                rotary: RotaryEmbedding, ctx: ForwardContext,
                layer_scalar: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), rope, rotary, ctx)
        x = x + self.post_attention_layernorm(h)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        weights, ids = self.router(x, self.method)
        routed = self.method.apply(self, self.pre_feedforward_layernorm_2(x), weights, ids)
        x = x + self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(routed))
        return x * layer_scalar
