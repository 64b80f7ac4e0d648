"""The Triton kernels on an FP8 KV cache against the PyTorch reference.

Write: the fused q/k norm + RoPE + K/V write kernel quantises K and V with the layer's scales to
the very bytes `dlrt.ops.reference.qk_norm_rope_write` stores (every tie between two e4m3
values, subnormals, values clamped at 448 * scale, scales 1, 2 and 0.37). Read: the paged
chunk-attention kernel reading an FP8 cache equals the SDPA backend reading the same cache
(dequantised), on contexts that are not a multiple of the page size and odd chunk lengths.
Runs under TRITON_INTERPRET=1 on the CPU and natively on the GPU (sm_89+); the read in bf16 on
the CPU too (its dots run on fp16 operands, which the interpreter computes in fp32). Tolerance
of the read: relative error < 1e-4 in fp32, < 2e-2 in bf16 against SDPA in bf16, as the BF16
cache's tests, and < 5e-3 in bf16 against SDPA in fp32 on the same bf16 q (the output's
rounding: the products are exact and p keeps 11 bits).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.attention.base import ForwardMeta  # noqa: E402
from dlrt.attention.kv_cache import PagedKVCache  # noqa: E402
from dlrt.attention.sdpa import SDPABackend  # noqa: E402
from dlrt.attention.triton import TritonBackend  # noqa: E402
from dlrt.kernels.rope import qk_norm_rope_write  # noqa: E402
from dlrt.layers.rotary import RotaryEmbedding  # noqa: E402
from dlrt.ops import reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])
needs_fp8_loads = pytest.mark.skipif(
    DEV == "cuda" and torch.cuda.get_device_capability() < (8, 9),
    reason="the attention kernel's FP8 loads need sm_89+")


def e4m3_edges() -> torch.Tensor:
    """Every finite e4m3 value, every midpoint between neighbours (the ties), and values just
    around them, plus values past +-448 (clamped) and fp32 subnormals."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = codes[torch.isfinite(codes)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([mids * (1 + 2**-20), mids * (1 - 2**-20)])
    far = torch.tensor([449.0, 464.0, 465.0, 1e4, -1e6, 1e-40, -1e-45, 0.0, -0.0])
    return torch.cat([grid, mids, near, far])


CASES = [  # n, hq, hkv, d, page, first position, norm, full precision, rotary dims, scales
    (4, 4, 2, 16, 16, 37, True, False, None, (1.0, 1.0)),
    (5, 8, 1, 32, 8, 0, True, False, None, (2.0, 0.5)),
    (3, 4, 4, 64, 4, 1001, False, True, None, (0.37, 3.1)),
    (7, 4, 2, 128, 16, 250, True, False, 64, (0.05, 0.02)),
    (3, 2, 1, 64, 8, 21, False, False, 16, (1.0, 0.37)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_write_kernel_stores_the_reference_bytes(case, dtype):
    n, hq, hkv, d, page, first, norm, fp32_rope, rot, (ks, vs) = case
    gen = torch.Generator().manual_seed(n * 37 + d)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen) * 4
    # the V part carries the hard cases (it is quantised as it comes): ties, clamps, zeros
    edges = (e4m3_edges() * vs)[torch.randperm(e4m3_edges().numel(), generator=gen)]
    v_part = qkv[:, (hq + hkv) * d:].reshape(-1)
    take = min(v_part.numel(), edges.numel())
    v_part[:take] = edges[:take]
    qkv[:, (hq + hkv) * d:] = v_part.reshape(n, -1)
    qkv = qkv.to(DEV, dtype)
    positions = torch.arange(first, first + n, device=DEV)
    pages = (first + n) // page + 3
    page_table = torch.randperm(pages, generator=gen).to(DEV, torch.int32)
    rotary = RotaryEmbedding(d, 1e6, full_precision=fp32_rope, rotary_dim=rot).to(DEV)
    cos, sin = rotary.cos_sin(positions)
    q_w = k_w = None
    if norm:
        q_w = (torch.rand(d, generator=gen) + 0.5).to(DEV, dtype)
        k_w = (torch.rand(d, generator=gen) + 0.5).to(DEV, dtype)
    k_scale = torch.tensor(ks, device=DEV)
    v_scale = torch.tensor(vs, device=DEV)
    caches = {}
    for name, op in (("triton", qk_norm_rope_write), ("reference", reference.qk_norm_rope_write)):
        k_cache = torch.full((pages, page, hkv, d), 0x55, dtype=torch.uint8).view(FP8).to(DEV)
        v_cache = k_cache.clone()
        q = op(qkv, hq, hkv, d, q_w, k_w, 1e-6, cos, sin, positions, k_cache, v_cache,
               page_table, fp32_rope, k_scale, v_scale)
        caches[name] = (q, k_cache.view(torch.uint8), v_cache.view(torch.uint8))
    (q, k, v), (ref_q, ref_k, ref_v) = caches["triton"], caches["reference"]
    assert torch.equal(v, ref_v)
    assert torch.equal(k, ref_k)
    if dtype == torch.float32:
        torch.testing.assert_close(q, ref_q, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(q.float(), ref_q.float(), rtol=2**-7, atol=1e-3)
    slots = page_table[positions // page].long() * page + positions % page
    untouched = torch.ones(pages * page, dtype=torch.bool, device=DEV)
    untouched[slots] = False
    assert (k.view(-1, hkv, d)[untouched] == 0x55).all()  # nothing written off the slots
    # the stored V is quantize_kv of the input V: clamped, and within e4m3's step of it
    stored = v.view(FP8).view(-1, hkv, d)[slots].float() * vs
    want = qkv[:, (hq + hkv) * d:].reshape(n, hkv, d).float().clamp(-448 * vs, 448 * vs)
    # (half a step: 2^-4 of the value, 2^-10 of the scale below e4m3's normals; fp32 slack)
    normal = want.abs() >= 2**-6 * vs
    err = (stored - want).abs() / (1 + 2**-16)
    assert (err <= 2**-4 * want.abs())[normal].all()
    assert (err <= 2**-10 * vs)[~normal].all()


def test_write_needs_the_scales():
    cache = torch.zeros(4, 16, 1, 16, device=DEV).to(FP8)
    cos = torch.zeros(2, 8, device=DEV)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        qk_norm_rope_write(torch.zeros(2, 64, device=DEV), 2, 1, 16, None, None, 1e-6, cos,
                           cos, torch.arange(2, device=DEV), cache, cache.clone(),
                           torch.arange(4, dtype=torch.int32, device=DEV), False)


READ_CASES = [  # n, hq, hkv, d, page, start, chunk_block, valid, k_scale, v_scale
    (4, 4, 2, 16, 16, 37, 4, 4, 0.37, 2.0),
    (5, 4, 4, 32, 8, 0, None, 5, 1.0, 1.0),
    (7, 8, 1, 16, 16, 50, 7, 7, 0.02, 0.3),
    (3, 2, 1, 64, 16, 3, 2, 3, 1.5, 0.7),
    (9, 4, 2, 128, 16, 100, 3, 9, 0.11, 4.0),
    (12, 4, 4, 16, 16, 0, None, 9, 0.5, 0.25),  # canvas padding: 3 rows past kv_len
]


@needs_fp8_loads
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", READ_CASES, ids=[str(c) for c in READ_CASES])
def test_attention_kernel_reads_fp8_as_sdpa(case, dtype):
    n, hq, hkv, d, page, start, cb, valid, ks, vs = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    num_layers, layer = 3, 1
    scales = torch.rand(num_layers, generator=gen) + 0.5
    k_scale, v_scale = scales.clone(), scales.flip(0)
    k_scale[layer], v_scale[layer] = ks, vs
    cache = PagedKVCache(num_layers, hkv, d, start + n + 21, FP8, DEV, page_size=page,
                         k_scale=k_scale, v_scale=v_scale)
    assert (start + valid) % page  # the context ends inside a page
    cache.page_table.copy_(torch.randperm(cache.num_pages, generator=gen).to(torch.int32))
    kv = start + n
    cache.write(layer, torch.arange(kv, device=DEV),
                (torch.randn(kv, hkv, d, generator=gen) * 3 * ks).to(DEV, dtype),
                (torch.randn(kv, hkv, d, generator=gen) * vs).to(DEV, dtype))
    q = torch.randn(n, hq, d, generator=gen).to(DEV, dtype)
    lens = torch.tensor([start, start + valid], dtype=torch.int32, device=DEV)
    meta = ForwardMeta(start + torch.arange(n, device=DEV), lens, cb)
    out = TritonBackend(cache, hq).forward(layer, q, d**-0.5, meta, cache)
    ref = SDPABackend(cache, hq).forward(layer, q, d**-0.5, meta, cache)
    assert out.dtype == ref.dtype == dtype
    rows = slice(0, valid)
    err = ((out[rows].double() - ref[rows].double()).norm() / ref[rows].double().norm()).item()
    assert err < (1e-4 if dtype == torch.float32 else 2e-2), err
    if dtype == torch.bfloat16:  # fp16 operands: the exact products, p with 11 bits
        ref32 = SDPABackend(cache, hq).forward(layer, q.float(), d**-0.5, meta, cache)
        err32 = ((out[rows].double() - ref32[rows].double()).norm()
                 / ref32[rows].double().norm()).item()
        assert err32 < 5e-3, err32
    # the scales are read from the cache: the same bytes under layer 0's scales differ
    for stored in (cache.k, cache.v):
        stored.view(torch.uint8)[0].copy_(stored.view(torch.uint8)[layer])
    other = TritonBackend(cache, hq).forward(0, q, d**-0.5, meta, cache)
    assert (other[rows].float() - out[rows].float()).abs().max() > 1e-2


def test_attention_needs_the_scales():
    from dlrt.kernels.paged_attention import paged_chunk_attention

    cache = torch.zeros(4, 16, 1, 16, device=DEV).to(FP8)
    lens = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        paged_chunk_attention(torch.zeros(4, 2, 16, device=DEV), cache, cache,
                              torch.arange(4, dtype=torch.int32, device=DEV), lens, 0.25, 4,
                              max_kv=64)
