"""LLaDA-8B (`modeling_llada.py`, block_type "llama"): OLMo names, fully bidirectional MHA.

Per block: attn_norm -> q/k/v_proj -> RoPE (fp32, `rope_full_precision`) -> attention ->
attn_out -> residual; ff_norm -> ff_out(silu(ff_proj(x)) * up_proj(x)) -> residual.
`ln_f` then `ff_out` (untied). No logit shift. q/k/v_proj (`qkv`) and ff_proj/up_proj
(`ff_gate_up`) are merged at load (`MergedLinear`); other module names equal checkpoint keys.
"""

import torch
from torch import nn

from dlrt.attention import ForwardContext
from dlrt.config import ModelConfig
from dlrt.layers import gemv_layer
from dlrt.layers import linear as lin
from dlrt.layers.attention import Attention
from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.mlp import silu_and_mul
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding


class LLaDALlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        c = config
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.ff_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        kv = c.num_kv_heads * c.head_dim
        self.qkv = MergedLinear(c.hidden_size, {"q_proj": c.num_heads * c.head_dim,
                                                "k_proj": kv, "v_proj": kv})
        self.attn_out = Linear(c.num_heads * c.head_dim, c.hidden_size)
        self.ff_gate_up = MergedLinear(c.hidden_size, {"ff_proj": c.intermediate_size,
                                                       "up_proj": c.intermediate_size})
        self.ff_out = Linear(c.intermediate_size, c.hidden_size)
        self.attn = Attention(layer_id, c.num_heads, c.num_kv_heads, c.head_dim)
        self.gemvs: gemv_layer.LayerGEMVs | None = None  # set by gemm_select.tune

    def dense_weights(self) -> gemv_layer.DenseWeights:
        """The norms and weights of the fused GEMV layer."""
        return gemv_layer.DenseWeights(self.attn_norm, self.qkv.weight, self.attn_out.weight,
                                       self.ff_norm, self.ff_gate_up.weight, self.ff_out.weight)

    def forward(self, x, residual, rope, rotary, ctx):
        """(previous output, residual stream before it or None) -> (output, residual)."""
        if gemv_layer.applies(self.gemvs, x):
            return gemv_layer.forward(x, residual, self.dense_weights(), self.gemvs,
                                      lambda qkv: self.attn(qkv, *rope, rotary, ctx))
        h, residual = self.attn_norm.add_norm(x, residual)
        h = self.attn_out(self.attn(self.qkv(h), *rope, rotary, ctx))
        h, residual = self.ff_norm(h, residual)
        return self.ff_out(silu_and_mul(self.ff_gate_up(h))), residual


class LLaDAModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.hidden_size),
            blocks=nn.ModuleList(LLaDALlamaBlock(config, i) for i in range(config.num_layers)),
            ln_f=RMSNorm(config.hidden_size, config.rms_norm_eps),
        ))
        if not config.tie_word_embeddings:
            self.transformer["ff_out"] = Linear(config.hidden_size, config.vocab_size)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, full_precision=True)


class LLaDAModelLM(nn.Module):
    """forward(input_ids [N], positions [N], ctx) -> hidden [N, H]; logits(hidden) -> [n, V]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LLaDAModel(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext) -> torch.Tensor:
        t = self.model.transformer
        x, residual = t.wte(input_ids), None
        rope = self.model.rotary_emb.cos_sin(positions)
        for block in t.blocks:
            x, residual = block(x, residual, rope, self.model.rotary_emb, ctx)
        return t.ln_f.add_norm(x, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        head = t.ff_out.weight if "ff_out" in t else t.wte.weight
        return lin.linear(hidden, head)
