"""SDAR (JetAstra/SDAR `modeling_sdar.py`): Qwen3 with block-diffusion attention.

Per layer: RMSNorm -> attention (q/k per-head RMSNorm before neox RoPE, GQA) -> residual ->
RMSNorm -> SwiGLU MLP or top-k MoE (`sdar_moe`) -> residual. q/k/v_proj and gate/up_proj are
merged into one weight each at load (`MergedLinear`); each residual add is fused into the next
RMSNorm. Untied `lm_head`, no logit shift:
the logits at position i predict the token at position i. Other names match the checkpoint keys.
"""

import torch
from torch import nn

from dlrt.attention.base import ForwardContext
from dlrt.layers.attention import Attention
from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.mlp import SwiGLU
from dlrt.layers.moe import FusedMoE, RouterSpec
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.models.config import ModelConfig
from dlrt.ops import Ops


class SDARAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        kv = c.num_kv_heads * c.head_dim
        self.qkv_proj = MergedLinear(c.hidden_size, {"q_proj": c.num_heads * c.head_dim,
                                                     "k_proj": kv, "v_proj": kv})
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, ops)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, ops)
        self.attn = Attention(layer_id, c.num_heads, c.num_kv_heads, c.head_dim, ops)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                rotary: RotaryEmbedding, ctx: ForwardContext) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [N, (Hq + 2 Hkv) D]
        return self.o_proj(self.attn(qkv, *rope, rotary, ctx, self.q_norm, self.k_norm))


class SDARDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        self.self_attn = SDARAttention(c, layer_id, ops)
        if layer_id in c.moe_layers:
            spec = RouterSpec("softmax", c.num_experts, c.num_experts_per_tok,
                              renormalize=c.norm_topk_prob)
            self.mlp = FusedMoE(c.hidden_size, c.moe_intermediate_size, spec, ops)
        else:
            self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, ops)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)

    def forward(self, x, residual, rope, rotary, ctx):
        """x: the previous layer's output [N, H]; residual: the stream before it (None at
        the first layer). Returns (this layer's output, residual); the sum is the stream."""
        h, residual = self.input_layernorm.add_norm(x, residual, self.self_attn.qkv_proj)
        h = self.self_attn(h, rope, rotary, ctx)
        h, residual = self.post_attention_layernorm(h, residual,
                                                    getattr(self.mlp, "gate_up_proj", None))
        return self.mlp(h), residual


class SDARModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(SDARDecoderLayer(config, i, ops)
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, input_ids, positions, ctx, embeds_add=None):
        x, residual = self.embed_tokens(input_ids), None
        if embeds_add is not None:
            x = x + embeds_add
        rope = self.rotary_emb.cos_sin(positions)
        for layer in self.layers:
            x, residual = layer(x, residual, rope, self.rotary_emb, ctx)
        return self.norm.add_norm(x, residual)[0]


class SDARForCausalLM(nn.Module):
    """forward(input_ids [N] int64, positions [N] int64, ctx, embeds_add [N, H] or None)
    -> hidden [N, H]; logits(hidden [n, H]) -> [n, V] in the model dtype. `embeds_add` (the
    model dtype) is added to the token embeddings (iteration smoothing's
    probability-weighted embeddings)."""

    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.config = config
        self.model = SDARModel(config, ops)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext, embeds_add: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, ctx, embeds_add)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
