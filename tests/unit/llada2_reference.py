"""A plain-PyTorch LLaDA2 MoE forward written from the official `modeling_llada2_moe.py`
semantics, independent of dlrt's layers, ops and loader: it reads the checkpoint's tensors by
their official names and runs the whole sequence at once under an explicit attention mask.

Per layer: RMSNorm -> query_key_value -> [N, Hq + 2 Hkv, D] split in head order -> per-head
RMSNorm of q and k (use_qk_norm) -> neox RoPE of the first int(D * partial_rotary_factor) dims
(cos/sin cast to the dtype) -> GQA attention (scores * D^-0.5 + additive mask, softmax in fp32)
-> dense -> residual -> RMSNorm -> dense SwiGLU (layers < first_k_dense_replace) or the MoE
block: fp32 sigmoid router, expert_bias for selection only, group-limited top-k (a group scored
by its two best), weights renormalised and times routed_scaling_factor, experts one by one,
plus the shared expert -> residual. Final RMSNorm, lm_head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def swiglu(x: torch.Tensor, t: dict, p: str) -> torch.Tensor:
    gate = x @ t[f"{p}.gate_proj.weight"].T
    up = x @ t[f"{p}.up_proj.weight"].T
    return (F.silu(gate) * up) @ t[f"{p}.down_proj.weight"].T


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, rot: int) -> torch.Tensor:
    """x [heads, N, D]; only dims < rot rotated."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    turned = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    return torch.cat((xr * cos + turned * sin, xp), dim=-1)


def router(x: torch.Tensor, t: dict, p: str, c: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [N, k], weights [N, k] fp32)."""
    e, k = c["num_experts"], c["num_experts_per_tok"]
    groups, keep = c.get("n_group", 8), c.get("topk_group", 4)
    logits = x.float() @ t[f"{p}.gate.weight"].float().T
    scores = torch.sigmoid(logits)
    biased = scores + t[f"{p}.gate.expert_bias"].float()
    n = x.shape[0]
    group_scores = biased.view(n, groups, -1).topk(2, dim=-1).values.sum(-1)
    chosen = group_scores.topk(keep, dim=-1).indices
    group_mask = torch.zeros(n, groups).scatter(1, chosen, 1.0)
    expert_mask = group_mask[:, :, None].expand(n, groups, e // groups).reshape(n, e)
    ids = biased.masked_fill(expert_mask == 0, -math.inf).topk(k, dim=-1).indices
    w = scores.gather(1, ids)
    if k > 1:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * c.get("routed_scaling_factor", 2.5)


def moe(x: torch.Tensor, t: dict, p: str, c: dict) -> torch.Tensor:
    ids, w = router(x, t, p, c)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for tok in range(x.shape[0]):
        for j in range(ids.shape[1]):
            y = swiglu(x[tok:tok + 1], t, f"{p}.experts.{int(ids[tok, j])}")
            out[tok] += w[tok, j] * y[0].float()
    y = out.to(x.dtype)
    if c.get("num_shared_experts"):
        y = y + swiglu(x, t, f"{p}.shared_experts")
    return y


def attention(x: torch.Tensor, t: dict, p: str, c: dict, positions: torch.Tensor,
              allow: torch.Tensor) -> torch.Tensor:
    hq, hkv = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // hq
    n = x.shape[0]
    qkv = (x @ t[f"{p}.query_key_value.weight"].T).view(n, hq + 2 * hkv, d).transpose(0, 1)
    q, k, v = qkv.split([hq, hkv, hkv], dim=0)
    if c.get("use_qk_norm", True):
        eps = c["rms_norm_eps"]
        q = rms(q, t[f"{p}.query_layernorm.weight"], eps)
        k = rms(k, t[f"{p}.key_layernorm.weight"], eps)
    rot = int(d * c.get("partial_rotary_factor", 0.5))
    q, k = rope(q, positions, c["rope_theta"], rot), rope(k, positions, c["rope_theta"], rot)
    k, v = k.repeat_interleave(hq // hkv, dim=0), v.repeat_interleave(hq // hkv, dim=0)
    scores = q @ k.transpose(1, 2) * d ** -0.5
    scores = scores + torch.zeros(n, n).masked_fill(~allow, -math.inf).to(x.dtype)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
    out = (probs @ v).transpose(0, 1).reshape(n, hq * d)
    return out @ t[f"{p}.dense.weight"].T


@torch.no_grad()
def forward(t: dict[str, torch.Tensor], c: dict, ids: torch.Tensor | None,
            allow: torch.Tensor, embeds: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [N, V] of token ids [N] (or input embeddings `embeds` [N, H]) at positions
    0..N-1; allow [N, N] bool (True: query i attends to key j). `t`: the checkpoint's tensors
    by name; `c`: its config.json."""
    eps = c["rms_norm_eps"]
    x = t["model.word_embeddings.weight"][ids] if embeds is None else embeds
    positions = torch.arange(x.shape[0])
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = rms(x, t[f"{p}.input_layernorm.weight"], eps)
        x = x + attention(h, t, f"{p}.attention", c, positions, allow)
        h = rms(x, t[f"{p}.post_attention_layernorm.weight"], eps)
        dense = c.get("num_experts") is None or i < c.get("first_k_dense_replace", 0)
        x = x + (swiglu(h, t, f"{p}.mlp") if dense else moe(h, t, f"{p}.mlp", c))
    return rms(x, t["model.norm.weight"], eps) @ t["lm_head.weight"].T
