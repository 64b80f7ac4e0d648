"""The Triton paged chunk-attention kernel with a sliding window, head sizes up to 512 and the
chunk's K/V beside the cache (DiffusionGemma), against SDPA in float64 under the SDPA backend's
mask (`dlrt.attention.sdpa.chunk_mask`, the definition in `dlrt.attention.base`).

Cached prefixes shorter than, equal to and longer than the window (W - 1, W, W + 1 and far
past it), causal (the encoder), block-causal and full (the decoder's canvas) chunks, GQA
groups 1..8, shuffled page tables, splits that the window's context start shifts. The chunk's
own K/V given beside the cache: the cache's slots at the chunk positions are poisoned with NaN
and never read. Runs under TRITON_INTERPRET=1 on the CPU and natively on the GPU.
Tolerance: relative Frobenius-norm error < 1e-5 in fp32 (CPU: measured up to 3e-7); bf16 at the real
shapes (GPU) < 2e-2, the bf16 bound of `test_paged_attention.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from dlrt.attention.sdpa import chunk_mask  # noqa: E402
from dlrt.kernels.paged_attention import (  # noqa: E402
    block_keys,
    default_splits,
    paged_chunk_attention,
    split_scratch,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL_F32, TOL_BF16 = 1e-5, 2e-2


def gather(cache, pt, length):
    """[length, Hkv, D] of a paged layer tensor [pages, page, Hkv, D]."""
    ps = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    return cache.reshape(-1, *cache.shape[2:])[pt[pos // ps].long() * ps + pos % ps]


def reference(q, k, v, start, kv_len, chunk_block, window, scale):
    """float64 SDPA of q [N, Hq, D] over k, v [kv_len, Hkv, D] under `chunk_mask`."""
    n, hq, _ = q.shape
    g = hq // k.shape[1]
    k, v = (t.double().repeat_interleave(g, 1).transpose(0, 1) for t in (k, v))
    mask = chunk_mask(n, start, kv_len, chunk_block, q.device, window)
    out = F.scaled_dot_product_attention(q.double().transpose(0, 1), k, v, attn_mask=mask,
                                         scale=scale)
    return out.transpose(0, 1)


def run_case(n, hq, hkv, d, page, start, chunk_block, window, splits, fresh, dtype, seed,
             capacity=None):
    """The kernel and the reference on one random case; returns their relative error."""
    gen = torch.Generator().manual_seed(seed)
    capacity = capacity or start + n + 24
    pages = -(-capacity // page)
    kc = torch.randn(pages, page, hkv, d, generator=gen).to(DEV, dtype)
    vc = torch.randn(pages, page, hkv, d, generator=gen).to(DEV, dtype)
    pt = torch.randperm(pages, generator=gen).to(torch.int32).to(DEV)
    q = torch.randn(n, hq, d, generator=gen).to(DEV, dtype)
    kv_len = start + n
    keys, values = gather(kc, pt, kv_len), gather(vc, pt, kv_len)
    chunk_kv = None
    if fresh:  # the chunk's own K/V beside the cache; its cache slots poisoned
        chunk_kv = (torch.randn(n, hkv, d, generator=gen).to(DEV, dtype),
                    torch.randn(n, hkv, d, generator=gen).to(DEV, dtype))
        keys = torch.cat([keys[:start], chunk_kv[0]])
        values = torch.cat([values[:start], chunk_kv[1]])
        pos = torch.arange(start, kv_len, device=DEV)
        slots = pt[pos // page].long() * page + pos % page
        for c in (kc, vc):
            c.view(-1, hkv, d)[slots] = float("nan")
    max_kv = pages * page if window is None else min(pages * page, window - 1 + n)
    lens = torch.tensor([start, kv_len], dtype=torch.int32, device=DEV)
    out = torch.full_like(q, float("nan"))
    scratch = split_scratch(n, hq, d, splits, DEV)
    for t in scratch:  # poisoned: the merge reads only the splits that were written
        t.fill_(float("nan"))
    scale = d**-0.5
    paged_chunk_attention(q, kc, vc, pt, lens, scale, chunk_block, max_kv=max_kv, splits=splits,
                          out=out, scratch=scratch, window=window, chunk_kv=chunk_kv)
    assert not torch.isnan(out).any()
    ref = reference(q, keys, values, start, kv_len, chunk_block, window, scale)
    return ((out.double() - ref).norm() / ref.norm()).item()


W = 8
# n, hq, hkv, d, page, start, chunk_block, window, splits, fresh
CASES = [
    (5, 4, 2, 64, 4, 3, 1, W, 2, False),  # encoder: prefix shorter than the window
    (6, 4, 2, 64, 4, W - 1, 1, W, 3, False),  # the reference's sliding cache: W - 1 keys
    (7, 8, 1, 64, 8, W, 1, W, 2, False),  # prefix = window
    (9, 4, 4, 64, 4, W + 1, 1, W, 4, False),
    (16, 4, 2, 128, 8, 45, 1, 16, 2, False),  # far past the window; several windows long
    (24, 2, 2, 64, 4, 30, 1, W, 1, False),  # a chunk longer than the window (prefill)
    (8, 4, 2, 64, 4, 19, 4, W, 2, False),  # block-causal with a window
    (8, 4, 2, 64, 4, 3, None, W, 2, True),  # decoder canvas: prefix shorter
    (8, 4, 2, 64, 4, W - 1, None, W, 2, True),
    (8, 8, 1, 64, 16, W, None, W, 3, True),  # prefix = window
    (12, 4, 2, 128, 4, 40, None, 16, 4, True),  # far past it
    (16, 8, 2, 128, 8, 21, None, 16, 2, True),
    (8, 4, 2, 64, 4, 0, None, W, 1, True),  # no prefix at all
    (8, 4, 1, 128, 4, 13, None, None, 2, True),  # a full layer: no window, chunk K/V
    (8, 4, 1, 128, 4, 13, 1, None, 2, False),  # a full layer in the encoder
    (5, 4, 2, 64, 4, 11, None, None, 2, False),  # no window, no chunk K/V: as before
    (3, 4, 1, 512, 4, 9, None, 6, 2, True),  # D = 512 (a full layer's head size)
    (4, 4, 1, 512, 4, 9, 1, None, 1, False),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_kernel_matches_the_sdpa_mask(case):
    err = run_case(*case, torch.float32, seed=hash(case) % 2**31)
    assert err < TOL_F32, err


def test_a_window_shifts_the_splits():
    """Splits share out the keys from start - W + 1: a long context with 4 splits of one tile
    each still covers the window (the old split over 0..kv_len would give one split all of
    it), and splits past the context write nothing the merge reads."""
    for start in (3, 50, 200):
        err = run_case(8, 4, 2, 64, 8, start, None, 16, 4, True, torch.float32, seed=start,
                       capacity=256)
        assert err < TOL_F32, (start, err)


def test_lengths_come_from_device_memory_with_a_window():
    """One launch configuration, three contexts: only `lens` changes between the calls."""
    gen = torch.Generator().manual_seed(5)
    kc = torch.randn(16, 8, 2, 64, generator=gen).to(DEV)
    vc = torch.randn(16, 8, 2, 64, generator=gen).to(DEV)
    pt = torch.randperm(16, generator=gen).to(torch.int32).to(DEV)
    q = torch.randn(6, 4, 64, generator=gen).to(DEV)
    lens = torch.zeros(2, dtype=torch.int32, device=DEV)
    for start in (2, 9, 100):
        lens.copy_(torch.tensor([start, start + 6]))
        out = paged_chunk_attention(q, kc, vc, pt, lens, 0.125, 1, max_kv=8 - 1 + 6, splits=2,
                                    window=8)
        keys, values = gather(kc, pt, start + 6), gather(vc, pt, start + 6)
        ref = reference(q, keys, values, start, start + 6, 1, 8, 0.125)
        assert (out.double() - ref).norm() / ref.norm() < TOL_F32


def test_bad_arguments_are_refused():
    q = torch.zeros(2, 2, 16)
    kc = torch.zeros(1, 4, 1, 16)
    lens = torch.tensor([0, 2], dtype=torch.int32)
    pt = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="window: a sliding window of at least 1"):
        paged_chunk_attention(q, kc, kc, pt, lens, 1.0, 1, 4, splits=1, window=0)
    fp8 = kc.to(torch.float8_e4m3fn)
    one = torch.ones(())
    with pytest.raises(ValueError, match="not served with an FP8 KV cache"):
        paged_chunk_attention(q, fp8, fp8, pt, lens, 1.0, None, 4, splits=1, k_scale=one,
                              v_scale=one, chunk_kv=(kc[0, :2], kc[0, :2]))


def test_launch_choices_at_head_size_512():
    cpu = torch.device("cpu")
    assert block_keys(10000, 4, 512) == 32 and block_keys(10000, 4, 256) == 64
    # 256 canvas rows x 8 query heads per KV head, 32 rows a tile: 64 tiles x 2 heads cover
    # the 16 SMs assumed on the CPU
    assert default_splits(40960, 256, 16, 2, cpu, 512) == 1
    assert default_splits(40960, 4, 16, 2, cpu, 512) == 32


# the real shapes (DiffusionGemma-26B-A4B): sliding layers 16 query / 8 KV heads of 256,
# window 1024; full layers 16 query / 2 KV heads of 512; canvas 256; bf16
REAL = [  # n, hq, hkv, d, page, start, chunk_block, window, splits, fresh
    (256, 16, 8, 256, 16, 700, None, 1024, 4, True),  # decoder, prefix shorter
    (256, 16, 8, 256, 16, 1023, None, 1024, 4, True),  # prefix W - 1
    (256, 16, 8, 256, 16, 1024, None, 1024, 8, True),
    (256, 16, 8, 256, 16, 9000, None, 1024, 8, True),  # far past the window
    (256, 16, 2, 512, 16, 9000, None, None, 8, True),  # full layer, decoder
    (256, 16, 8, 256, 16, 3000, 1, 1024, 4, False),  # encoder: a committed canvas
    (256, 16, 2, 512, 16, 3000, 1, None, 4, False),
    (2000, 16, 8, 256, 16, 0, 1, 1024, 1, False),  # encoder: a prompt prefill
    (2000, 16, 2, 512, 16, 0, 1, None, 1, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", REAL, ids=[str(c) for c in REAL])
def test_real_shapes_in_bf16(case):
    err = run_case(*case, torch.bfloat16, seed=hash(case) % 2**31)
    assert err < TOL_BF16, err


@pytest.mark.gpu
def test_a_captured_decoder_forward_replays():
    """A captured canvas forward (window, chunk K/V) replays for new queries."""
    from kernel_checks import assert_replay_matches_eager

    gen = torch.Generator(device="cuda").manual_seed(0)
    kc = torch.randn(700, 16, 8, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    vc = torch.randn_like(kc)
    pt = torch.randperm(700, device="cuda", generator=gen).to(torch.int32)
    ck, cv = (torch.randn(256, 8, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
              for _ in range(2))
    lens = torch.tensor([5000, 5256], dtype=torch.int32, device="cuda")
    splits = default_splits(1024 - 1 + 256, 256, 16, 8, torch.device("cuda"), 256)
    scratch = split_scratch(256, 16, 256, splits, "cuda")

    def run(q):
        return paged_chunk_attention(q, kc, vc, pt, lens, 1.0, None, 1024 - 1 + 256, splits,
                                     scratch=scratch, window=1024, chunk_kv=(ck, cv))

    assert_replay_matches_eager(run, (256, 16, 256))
