"""A plain-PyTorch LLaDA-MoE forward transcribed from the official `modeling_lladamoe.py`
(`LLaDAMoEModelLM`, eager attention, no mask, no cache), independent of dlrt's layers, ops and
loader: it reads the checkpoint's tensors by their official names.

Per layer: RMSNorm (fp32 inside, weight times the input-dtype result) -> q/k/v_proj -> q and k
reshaped to [N * heads, D] and RMS-normed per head (q_norm, k_norm) -> RoPE (rotate_half, cos
and sin in fp32 then cast) -> repeat_kv -> scores / sqrt(D), softmax in fp32, no mask (full
attention) -> o_proj -> residual -> RMSNorm -> the MoE block (`moe_layer_freq` 1: softmax over
all experts in fp32, top-k, NOT renormalised whatever `norm_topk_prob` says, the experts one by
one with `index_add_`) or the dense MLP -> residual. Final RMSNorm, lm_head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def mlp(x: torch.Tensor, t: dict, p: str) -> torch.Tensor:
    gate, up = x @ t[f"{p}.gate_proj.weight"].T, x @ t[f"{p}.up_proj.weight"].T
    return (F.silu(gate) * up) @ t[f"{p}.down_proj.weight"].T


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def router(x: torch.Tensor, t: dict, p: str, c: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [N, k] in x's dtype, expert ids [N, k]) of `LLaDAMoESparseMoeBlock`."""
    logits = x @ t[f"{p}.gate.weight"].T
    weights = F.softmax(logits, dim=1, dtype=torch.float)
    weights, ids = torch.topk(weights, c["num_experts_per_tok"], dim=-1)
    return weights.to(x.dtype), ids  # NOTE: norm_topk_prob is False in the official block


def moe(x: torch.Tensor, t: dict, p: str, c: dict) -> torch.Tensor:
    weights, ids = router(x, t, p, c)
    out = torch.zeros_like(x)
    expert_mask = F.one_hot(ids, num_classes=c["num_experts"]).permute(2, 1, 0)
    for e in range(c["num_experts"]):
        idx, top_x = torch.where(expert_mask[e])
        y = mlp(x[top_x], t, f"{p}.experts.{e}") * weights[top_x, idx, None]
        out.index_add_(0, top_x, y.to(x.dtype))
    return out


def forward(t: dict, c: dict, ids: torch.Tensor) -> torch.Tensor:
    """ids [N] -> logits [N, V] of the whole sequence (positions 0..N-1)."""
    n, hidden, heads = ids.shape[0], c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    d, eps = hidden // heads, c["rms_norm_eps"]
    inv_freq = 1.0 / c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
    freqs = torch.arange(n).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    x = t["model.embed_tokens.weight"][ids]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = rms(x, t[f"{p}.input_layernorm.weight"], eps)
        a = f"{p}.self_attn"
        q = rms((h @ t[f"{a}.q_proj.weight"].T).reshape(-1, d), t[f"{a}.q_norm.weight"], eps)
        k = rms((h @ t[f"{a}.k_proj.weight"].T).reshape(-1, d), t[f"{a}.k_norm.weight"], eps)
        v = h @ t[f"{a}.v_proj.weight"].T
        q = q.view(n, heads, d).transpose(0, 1)
        k = k.view(n, kv, d).transpose(0, 1)
        v = v.view(n, kv, d).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        s = q @ k.transpose(1, 2) / math.sqrt(d)
        att = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = (att @ v).transpose(0, 1).reshape(n, hidden)
        x = x + o @ t[f"{a}.o_proj.weight"].T
        h = rms(x, t[f"{p}.post_attention_layernorm.weight"], eps)
        freq = c.get("moe_layer_freq") or [1] * c["num_hidden_layers"]
        x = x + (moe(h, t, f"{p}.mlp", c) if freq[i] else mlp(h, t, f"{p}.mlp"))
    return rms(x, t["model.norm.weight"], eps) @ t["lm_head.weight"].T
