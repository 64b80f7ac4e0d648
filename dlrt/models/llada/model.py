"""LLaDA-8B (`modeling_llada.py`, block_type "llama"): OLMo names, fully bidirectional MHA.

Per block: attn_norm -> q/k/v_proj -> RoPE (fp32, `rope_full_precision`) -> attention ->
attn_out -> residual; ff_norm -> ff_out(silu(ff_proj(x)) * up_proj(x)) -> residual.
`ln_f` then `ff_out` (untied; tied: `wte`'s weight). No logit shift. q/k/v_proj (`qkv`) and
ff_proj/up_proj (`ff_gate_up`) are merged at load (`MergedLinear`); other module names equal
checkpoint keys.
"""

import torch
from torch import nn

from dlrt.attention.base import ForwardContext
from dlrt.layers.attention import Attention
from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.mlp import silu_and_mul_for
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.models.config import ModelConfig
from dlrt.ops import Ops


class LLaDALlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, ops: Ops):
        super().__init__()
        c = config
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)
        self.ff_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops)
        kv = c.num_kv_heads * c.head_dim
        self.qkv = MergedLinear(c.hidden_size, {"q_proj": c.num_heads * c.head_dim,
                                                "k_proj": kv, "v_proj": kv})
        self.attn_out = Linear(c.num_heads * c.head_dim, c.hidden_size)
        self.ff_gate_up = MergedLinear(c.hidden_size, {"ff_proj": c.intermediate_size,
                                                       "up_proj": c.intermediate_size})
        self.ff_out = Linear(c.intermediate_size, c.hidden_size)
        self.attn = Attention(layer_id, c.num_heads, c.num_kv_heads, c.head_dim, ops)
        self.ops = ops

    def forward(self, x, residual, rope, rotary, ctx):
        """(previous output, residual stream before it or None) -> (output, residual)."""
        h, residual = self.attn_norm.add_norm(x, residual, self.qkv)
        h = self.attn_out(self.attn(self.qkv(h), *rope, rotary, ctx))
        h, residual = self.ff_norm(h, residual, self.ff_gate_up)
        return self.ff_out(silu_and_mul_for(self.ops, self.ff_gate_up(h), self.ff_out)), residual


class LLaDAModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.hidden_size),
            blocks=nn.ModuleList(LLaDALlamaBlock(config, i, ops)
                                 for i in range(config.num_layers)),
            ln_f=RMSNorm(config.hidden_size, config.rms_norm_eps, ops),
            ff_out=Linear(config.hidden_size, config.vocab_size),
        ))
        if config.tie_word_embeddings:  # the checkpoint has no ff_out: the head is wte
            self.transformer["ff_out"].weight = self.transformer["wte"].weight
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, full_precision=True)


class LLaDAModelLM(nn.Module):
    """forward(input_ids [N], positions [N], ctx, embeds_add [N, H] or None) -> hidden [N, H];
    logits(hidden) -> [n, V]. `embeds_add` (the model dtype) is added to the token embeddings
    (iteration smoothing's probability-weighted embeddings)."""

    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.config = config
        self.model = LLaDAModel(config, ops)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext, embeds_add: torch.Tensor | None = None) -> torch.Tensor:
        t = self.model.transformer
        x, residual = t.wte(input_ids), None
        if embeds_add is not None:
            x = x + embeds_add
        rope = self.model.rotary_emb.cos_sin(positions)
        for block in t.blocks:
            x, residual = block(x, residual, rope, self.model.rotary_emb, ctx)
        return t.ln_f.add_norm(x, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.transformer.ff_out(hidden)
