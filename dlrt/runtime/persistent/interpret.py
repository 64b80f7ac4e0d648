"""A round plan run task by task in PyTorch: the reference of what the persistent kernel
computes, on the model's own weights and KV cache.

`run_plan(plan, model, cache, tokens, lens, chunk_block)` executes `plan.tasks` in the order
`simulate` completes them (so a task reads only what its waits guarantee), with the numerics of
the layer path on the reference ops (`dlrt.ops.reference`): RMSNorm statistics in fp32, each
projection's output rounded to the model dtype, the residual adds in the model dtype, SiLU-and-
mul as `silu_and_mul`, q/k norm and RoPE as `qk_norm_rope_write`. Attention differs from the
layer path only in fp32 summation order: each split keeps an online-softmax state (max, sum,
fp32 output) of its keys and the merge rescales them, as the paged kernel does; a split holds
ceil(kv_len / splits) keys of the context read at run time.
Dense SDAR models with model-dtype or weight-only FP8 projections (dequantised as the layer
path's reference does) and an unquantised model-dtype or FP8 KV cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.sdpa import chunk_mask
from dlrt.layers.quant.fp8 import dequantize_fp8_block
from dlrt.ops import reference as ref
from dlrt.runtime.persistent.plan import RoundPlan, fp8_layer, simulate


class _Round:
    """The buffers one round's tasks read and write."""

    def __init__(self, plan: RoundPlan, model, cache: PagedKVCache, tokens: torch.Tensor,
                 lens: torch.Tensor, chunk_block: int | None):
        c = plan.config
        self.plan, self.model, self.cache, self.c = plan, model, cache, c
        self.names = plan.weights
        embedding = model.get_parameter(self.names.embedding)
        self.rotary = model.get_submodule(self.names.rotary)
        self.dtype = embedding.dtype
        self.start, self.kv_len = (int(x) for x in lens.tolist())
        b = tokens.shape[0]
        self.positions = self.start + torch.arange(b, device=tokens.device)
        self.cos, self.sin = self.rotary.cos_sin(self.positions)
        self.mask = chunk_mask(b, self.start, self.kv_len, chunk_block, tokens.device)
        self.stream = F.embedding(tokens, embedding)  # [B, H], the residual stream
        d, hq, hkv = c.head_dim, c.num_heads, c.num_kv_heads
        new = lambda n: torch.empty(b, n, dtype=self.dtype, device=tokens.device)  # noqa: E731
        self.qkv = new((hq + 2 * hkv) * d)
        self.attn_out = new(hq * d)
        self.act = new(c.intermediate_size)
        self.logits = new(c.vocab_size)
        self.parts: dict[tuple[int, int, int], tuple[torch.Tensor, ...]] = {}
        self.weights: dict[str, torch.Tensor] = {}

    def norm(self, name: str) -> torch.Tensor:
        w = self.model.get_parameter(name)  # by path: tied weights too, as the kernel
        return ref.rms_norm(self.stream, w, self.c.rms_norm_eps)

    def weight(self, name: str) -> torch.Tensor:
        """The projection weight `name` in the model dtype: the parameter, or a weight-only
        FP8 layer's weight dequantised (code times block scale, rounded to the model dtype,
        as the layer path's reference). ValueError for an FP8 layer with quantised
        activations (W8A8), which the kernel does not compute."""
        if name not in self.weights:
            w = self.model.get_parameter(name)  # by path: tied weights too, as the kernel
            module = fp8_layer(self.model, name)
            if module is not None:
                w = dequantize_fp8_block(w, module.weight_scale_inv, self.dtype)
            self.weights[name] = w
        return self.weights[name]

    def linear(self, x: torch.Tensor, weight: str, lo: int, hi: int) -> torch.Tensor:
        return F.linear(x, self.weight(weight)[lo:hi])

    def run(self, t) -> None:
        getattr(self, "_" + t.kind)(t)

    def _qkv(self, t) -> None:
        h = self.norm(self.names.at("input_norm", t.layer))
        self.qkv[:, t.lo:t.hi] = self.linear(h, t.weight, t.lo, t.hi)

    def _rope(self, t) -> torch.Tensor:
        """q/k RMSNorm and RoPE of KV head g's rows of the block: the rotated queries
        [B, G, D] (model dtype); the block's K/V written into the cache (every split of the
        head writes the same values; the kernel's split 0 writes them, the other splits keep
        their own copy)."""
        c, g = self.c, t.head
        d, hq, hkv = c.head_dim, c.num_heads, c.num_kv_heads
        group = hq // hkv
        q = self.qkv[:, g * group * d:(g + 1) * group * d].reshape(-1, group, d)
        k = self.qkv[:, (hq + g) * d:(hq + g + 1) * d].reshape(-1, 1, d)
        v = self.qkv[:, (hq + hkv + g) * d:(hq + hkv + g + 1) * d].reshape(-1, 1, d)
        eps = c.rms_norm_eps
        q = ref.rms_norm(q, self.model.get_parameter(self.names.at("q_norm", t.layer)), eps)
        k = ref.rms_norm(k, self.model.get_parameter(self.names.at("k_norm", t.layer)), eps)
        full = self.rotary.full_precision
        k = ref.rope_rotate(k, self.cos, self.sin, full)
        slots = self.cache.slots(self.positions)
        k_scale, v_scale = self.cache.scales(t.layer)
        for store, x, scale in ((self.cache.k[t.layer], k, k_scale),
                                (self.cache.v[t.layer], v, v_scale)):
            flat = store.view(-1, hkv, d)
            if store.dtype == ref.KV_FP8:
                flat, x = flat.view(torch.uint8), ref.quantize_kv(x, scale).view(torch.uint8)
            flat[slots, g] = x[:, 0]
        return ref.rope_rotate(q, self.cos, self.sin, full)

    def _attn(self, t) -> None:
        c, g = self.c, t.head
        group = c.num_heads // c.num_kv_heads
        q = self._rope(t).float()  # [B, G, D]
        span = max(-(-self.kv_len // self.plan.splits), 1)
        lo, hi = t.split * span, min((t.split + 1) * span, self.kv_len)
        b = q.shape[0]
        if lo >= hi:
            dev = q.device
            part = (torch.full((b, group), float("-inf"), device=dev),
                    torch.zeros(b, group, device=dev),
                    torch.zeros(b, group, c.head_dim, device=dev))
        else:
            k, v = self._keys(t.layer, g, lo, hi)  # [n, D] fp32
            s = torch.einsum("bgd,nd->bgn", q, k) * c.head_dim ** -0.5
            if self.mask is not None:
                s = s.masked_fill(~self.mask[:, None, lo:hi], float("-inf"))
            m = s.amax(dim=-1)
            m_safe = torch.where(m == float("-inf"), 0.0, m)
            p = torch.exp(s - m_safe[..., None])
            part = (m, p.sum(-1), torch.einsum("bgn,nd->bgd", p, v))
        self.parts[(t.layer, g, t.split)] = part
        if sum(key[:2] == (t.layer, g) for key in self.parts) == self.plan.splits:
            self._merge(t)  # the last split of the head

    def _keys(self, layer: int, g: int, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
        """K and V of KV head g at positions lo..hi-1, fp32 (an FP8 cache's dequantised)."""
        cache, d = self.cache, self.c.head_dim
        slots = cache.slots(torch.arange(lo, hi, device=cache.page_table.device))
        out = []
        for store, scale in zip((cache.k[layer], cache.v[layer]), cache.scales(layer),
                                strict=True):
            if store.dtype == ref.KV_FP8:
                x = store.view(torch.uint8).view(-1, self.c.num_kv_heads, d)[slots, g]
                out.append(ref.dequantize_kv(x.view(ref.KV_FP8), scale, torch.float32))
            else:
                out.append(store.view(-1, self.c.num_kv_heads, d)[slots, g].float())
        return tuple(out)

    def _merge(self, t) -> None:
        c, g = self.c, t.head
        group, d = c.num_heads // c.num_kv_heads, c.head_dim
        ms, ls, accs = zip(*(self.parts[(t.layer, g, s)] for s in range(self.plan.splits)),
                           strict=True)
        m = torch.stack(ms)  # [S, B, G]
        w = torch.exp(m - m.amax(dim=0))
        w = torch.where(torch.isnan(w), 0.0, w)  # splits with no visible key
        out = (w[..., None] * torch.stack(accs)).sum(0) / (w * torch.stack(ls)).sum(0)[..., None]
        self.attn_out[:, g * group * d:(g + 1) * group * d] = out.reshape(-1, group * d)

    def _residual(self, t, y: torch.Tensor) -> None:
        self.stream[:, t.lo:t.hi] = y + self.stream[:, t.lo:t.hi]

    def _o(self, t) -> None:
        self._residual(t, self.linear(self.attn_out, t.weight, t.lo, t.hi))

    def _gate_up(self, t) -> None:
        h = self.norm(self.names.at("post_norm", t.layer))
        inter = self.c.intermediate_size
        gate = self.linear(h, t.weight, t.lo, t.hi)
        up = self.linear(h, t.weight, inter + t.lo, inter + t.hi)
        self.act[:, t.lo:t.hi] = ref.silu_and_mul(torch.cat([gate, up], dim=-1))

    def _down(self, t) -> None:
        self._residual(t, self.linear(self.act, t.weight, t.lo, t.hi))

    def _lm_head(self, t) -> None:
        h = self.norm(self.names.final_norm)
        self.logits[:, t.lo:t.hi] = self.linear(h, t.weight, t.lo, t.hi)


@torch.inference_mode()
def run_plan(plan: RoundPlan, model, cache: PagedKVCache, tokens: torch.Tensor,
             lens: torch.Tensor, chunk_block: int | None) -> torch.Tensor:
    """The logits [B, V] (model dtype) of a block's round: tokens [B] at positions
    lens[0]..lens[0]+B-1 over cache keys < lens[1] (the block's K/V written into the cache),
    as `ModelRunner.forward(tokens, lens, chunk_block, rows=slice(None))` computes them.

    Raises ValueError when tokens do not have the plan's block length."""
    if tokens.shape[0] != plan.block:
        raise ValueError(f"run_plan: {tokens.shape[0]} tokens for a plan of block "
                         f"{plan.block}")
    r = _Round(plan, model, cache, tokens, lens, chunk_block)
    for i in simulate(plan, rounds=1):
        r.run(plan.tasks[i])
    return r.logits
