"""SDAR (Qwen3 layout) in plain PyTorch with autograd, for training.

dlrt's own model (`dlrt.models.sdar`) is built for inference (merged projections, a paged KV
cache, no autograd path). This one has the same computation and the checkpoint's tensor names
(`model.layers.{i}.self_attn.q_proj.weight`, ...), so its `state_dict` is an SDAR checkpoint:
per layer RMSNorm -> attention (per-head q/k RMSNorm, neox RoPE, GQA, scale D^-1/2) ->
residual -> RMSNorm -> SwiGLU -> residual; final RMSNorm; LM head (tied to the embedding when
`tie_word_embeddings`). Attention takes an explicit [N, N] bool mask (True = attend), so one
forward serves the block-diffusion training layout (`dlrt.train.objective`) and the plain
block-causal layout of inference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    """Sizes of the model; the SDAR `config.json` fields of the same names."""

    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 7
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02

    def as_config(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    """weight * (x / sqrt(mean(x^2) + eps)); statistics in fp32, cast back before the weight
    (`dlrt.ops.reference.rms_norm`)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox RoPE of x [B, N, H, D] with cos, sin [N, D/2] fp32."""
    cos = torch.cat((cos, cos), dim=-1)[None, :, None, :].to(x.dtype)  # [1, N, 1, D]
    sin = torch.cat((sin, sin), dim=-1)[None, :, None, :].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (s.num_attention_heads,
                                                    s.num_key_value_heads, s.head_dim)
        self.q_proj = nn.Linear(s.hidden_size, self.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, self.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, self.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * s.head_dim, s.hidden_size, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allow: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = rope(self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)), cos, sin)
        k = rope(self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)
        q, k = q.to(v.dtype), k.to(v.dtype)  # NOTE: fp32 norm weights under autocast
        group = self.heads // self.kv_heads
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, N, D]
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow)  # [B, Hq, N, D]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s: Shape, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout
        self.self_attn = Attention(s)
        self.mlp = MLP(s)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x, cos, sin, allow):
        p = self.dropout if self.training else 0.0  # residual-branch dropout, training only
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin, allow), p)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), p)


class Trunk(nn.Module):
    def __init__(self, s: Shape, dropout: float = 0.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(s, dropout) for _ in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)


class SDARTrainModel(nn.Module):
    """forward(ids [B, N], positions [N], allow [N, N] bool) -> hidden [B, N, H];
    logits(hidden [..., H]) -> [..., V]. Logits at position i predict the token at i.
    `dropout`: the probability of dropping an element of each attention and MLP output before
    its residual add, in training mode only (no parameters: the checkpoint is unchanged)."""

    def __init__(self, s: Shape, dropout: float = 0.0):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout {dropout} is not in [0, 1)")
        self.shape = s
        self.model = Trunk(s, dropout)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        if s.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq = 1.0 / s.rope_theta ** (torch.arange(0, s.head_dim, 2).float() / s.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, initializer_range) weights; the projections into the residual stream
        (o_proj, down_proj) scaled by 1/sqrt(2 * layers); norms at 1."""
        std = self.shape.initializer_range
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=std / (2 * self.shape.num_hidden_layers) ** 0.5)
            else:
                nn.init.normal_(p, std=std)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor,
                allow: torch.Tensor) -> torch.Tensor:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [N, D/2] fp32
        cos, sin = freqs.cos(), freqs.sin()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, allow)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def num_parameters(self) -> int:
        """Parameters counted once (a tied head is the embedding)."""
        return sum(p.numel() for p in self.parameters())

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The SDAR checkpoint's tensors (a tied head is not written: dlrt and transformers
        tie it to `model.embed_tokens.weight`)."""
        out = {k: v for k, v in self.state_dict().items()}
        if self.shape.tie_word_embeddings:
            out.pop("lm_head.weight")
        return out
