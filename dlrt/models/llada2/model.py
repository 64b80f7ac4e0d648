"""LLaDA2 MoE (inclusionAI/LLaDA2.0 `modeling_llada2_moe.py`) with block-diffusion attention.

Per layer: input_layernorm -> attention (one fused `query_key_value` projection in q, k, v head
order; per-head `query_layernorm` / `key_layernorm` RMSNorm over the whole head when
use_qk_norm; neox RoPE of the first rotary_dim dims only (partial RoPE, cos/sin cast to the
dtype); GQA; `dense`) -> residual -> post_attention_layernorm -> MLP -> residual. The MLP of
layers < first_k_dense_replace is a dense SwiGLU (`mlp.gate_proj` / `up_proj`, merged at load,
/ `down_proj`); the others are the MoE block (`dlrt.layers.moe`: the sigmoid router with
`gate.expert_bias` and group-limited top-k, `experts.{e}`, `shared_experts`). `model.norm`,
untied `lm_head`, no logit shift: the logits at position i predict the token at position i.
Module names equal the checkpoint keys (merged and stacked weights: `dlrt.checkpoint.loader`).
"""

import torch
from torch import nn

from dlrt.attention.base import ForwardContext
from dlrt.layers.attention import Attention
from dlrt.layers.linear import Linear
from dlrt.layers.mlp import SwiGLU
from dlrt.layers.moe import FusedMoE, RouterSpec
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.models.config import ModelConfig
from dlrt.ops import Ops


class LLaDA2Attention(nn.Module):
    """x [N, H] -> [N, H]."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        self.query_key_value = Linear(c.hidden_size,
                                      (c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
        self.dense = Linear(c.num_heads * c.head_dim, c.hidden_size)
        if c.use_qk_norm:
            self.query_layernorm = RMSNorm(c.head_dim, c.rms_norm_eps, ops)
            self.key_layernorm = RMSNorm(c.head_dim, c.rms_norm_eps, ops)
        else:
            self.query_layernorm = self.key_layernorm = None
        self.attn = Attention(layer_id, c.num_heads, c.num_kv_heads, c.head_dim, ops)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                rotary: RotaryEmbedding, ctx: ForwardContext) -> torch.Tensor:
        qkv = self.query_key_value(x)  # [N, (Hq + 2 Hkv) D]
        return self.dense(self.attn(qkv, *rope, rotary, ctx, self.query_layernorm,
                                    self.key_layernorm))


def _mlp(c: ModelConfig, layer_id: int, ops: Ops) -> nn.Module:
    if layer_id not in c.moe_layers:
        return SwiGLU(c.hidden_size, c.intermediate_size, ops)
    spec = RouterSpec(c.router_scoring, c.num_experts, c.num_experts_per_tok,
                      renormalize=c.norm_topk_prob, n_group=c.n_group,
                      topk_group=c.topk_group, scaling=c.routed_scaling_factor)
    return FusedMoE(c.hidden_size, c.moe_intermediate_size, spec, ops,
                    shared_intermediate=c.moe_intermediate_size * c.num_shared_experts)


class LLaDA2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        self.attention = LLaDA2Attention(c, layer_id, ops)
        self.mlp = _mlp(c, layer_id, ops)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)

    def forward(self, x, residual, rope, rotary, ctx):
        """x: the previous layer's output [N, H]; residual: the stream before it (None at
        the first layer). Returns (this layer's output, residual); the sum is the stream."""
        h, residual = self.input_layernorm.add_norm(x, residual,
                                                    self.attention.query_key_value)
        h = self.attention(h, rope, rotary, ctx)
        h, residual = self.post_attention_layernorm(h, residual,
                                                    getattr(self.mlp, "gate_up_proj", None))
        return self.mlp(h), residual


class LLaDA2Model(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        c = config
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(LLaDA2DecoderLayer(c, i, ops) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)
        self.rotary_emb = RotaryEmbedding(c.head_dim, c.rope_theta, rotary_dim=c.rotary_dim)

    def forward(self, input_ids, positions, ctx, embeds_add=None):
        x, residual = self.word_embeddings(input_ids), None
        if embeds_add is not None:
            x = x + embeds_add
        rope = self.rotary_emb.cos_sin(positions)  # [N, rotary_dim / 2] each
        for layer in self.layers:
            x, residual = layer(x, residual, rope, self.rotary_emb, ctx)
        return self.norm.add_norm(x, residual)[0]


class LLaDA2MoeModelLM(nn.Module):
    """forward(input_ids [N] int64, positions [N] int64, ctx, embeds_add [N, H] or None)
    -> hidden [N, H]; logits(hidden [n, H]) -> [n, V] in the model dtype. `embeds_add` (the
    model dtype) is added to the token embeddings (iteration smoothing's
    probability-weighted embeddings)."""

    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.config = config
        self.model = LLaDA2Model(config, ops)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext, embeds_add: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, ctx, embeds_add)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
