"""SDAR (JetAstra/SDAR `modeling_sdar.py`): Qwen3 with block-diffusion attention.

Per layer: RMSNorm -> attention (q/k per-head RMSNorm before neox RoPE, GQA) -> residual ->
RMSNorm -> SwiGLU MLP or top-k MoE (`sdar_moe`) -> residual. Untied `lm_head`, no logit shift:
the logits at position i predict the token at position i. Names match the checkpoint keys.
"""

import torch
from torch import nn

from dlrt.attention import ForwardContext
from dlrt.config import ModelConfig
from dlrt.layers.attention import Attention
from dlrt.layers.mlp import SparseMoE, SwiGLU
from dlrt.layers.norm import RMSNorm
from dlrt.layers.rotary import RotaryEmbedding


class SDARAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.attn = Attention(layer_id, c.num_heads, c.num_kv_heads, c.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding,
                ctx: ForwardContext) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))


class SDARDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        c = config
        self.self_attn = SDARAttention(c, layer_id)
        if layer_id in c.moe_layers:
            self.mlp = SparseMoE(c.hidden_size, c.moe_intermediate_size, c.num_experts,
                                 c.num_experts_per_tok, c.norm_topk_prob)
        else:
            self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, positions, rotary, ctx):
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class SDARModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(SDARDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, input_ids, positions, ctx):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.rotary_emb, ctx)
        return self.norm(x)


class SDARForCausalLM(nn.Module):
    """forward(input_ids [N] int64, positions [N] int64, ctx) -> hidden [N, H];
    logits(hidden [n, H]) -> [n, V] in the model dtype."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = SDARModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: ForwardContext) -> torch.Tensor:
        return self.model(input_ids, positions, ctx)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
