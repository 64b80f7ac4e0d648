"""LLaDA-8B (`modeling_llada.py`, block_type "llama"): OLMo names, fully bidirectional MHA.

Per block: attn_norm -> q/k/v_proj -> RoPE (fp32, `rope_full_precision`) -> attention ->
attn_out -> residual; ff_norm -> ff_out(silu(ff_proj(x)) * up_proj(x)) -> residual.
`ln_f` then `ff_out` (untied). No logit shift. Module names equal checkpoint keys.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dlrt.attention import ForwardContext
from dlrt.config import ModelConfig
from dlrt.layers.attention import Attention
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding


class LLaDALlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.ff_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.attn_out = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.ff_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.ff_out = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.attn = Attention(layer_id, c.num_heads, c.num_kv_heads, c.head_dim)

    def forward(self, x, positions, rotary, ctx):
        n = x.shape[0]
        h = self.attn_norm(x)
        q = self.q_proj(h).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(h).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(h).view(n, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k)
        x = x + self.attn_out(self.attn(q, k, v, ctx))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class LLaDAModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.hidden_size),
            blocks=nn.ModuleList(LLaDALlamaBlock(config, i) for i in range(config.num_layers)),
            ln_f=RMSNorm(config.hidden_size, config.rms_norm_eps),
        ))
        if not config.tie_word_embeddings:
            self.transformer["ff_out"] = nn.Linear(config.hidden_size, config.vocab_size,
                                                   bias=False)
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
        x = t.wte(input_ids)
        for block in t.blocks:
            x = block(x, positions, self.model.rotary_emb, ctx)
        return t.ln_f(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        head = t.ff_out.weight if "ff_out" in t else t.wte.weight
        return F.linear(hidden, head)
