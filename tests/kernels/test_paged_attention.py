"""The Triton paged chunk-attention kernel against PyTorch SDPA (float64 reference).

Awkward shapes: odd chunk lengths, head dims 16..128, GQA groups 1..8, block lengths 1..64,
page sizes that do not divide the context, contexts crossing page and split boundaries, a
shuffled page table. Runs under TRITON_INTERPRET=1 on the CPU and natively on the GPU.
Tolerance: relative error < 1e-4 in fp32, < 2e-2 in bf16 (GPU).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from dlrt.kernels.paged_attention import paged_chunk_attention, split_scratch  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, kc, vc, pt, start, kv_len, cb):
    n, hq, d = q.shape
    ps, hkv = kc.shape[1], kc.shape[2]
    pos = torch.arange(kv_len, device=q.device)
    slots = pt[pos // ps].long() * ps + pos % ps
    k = kc.reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
    v = vc.reshape(-1, hkv, d)[slots].double().repeat_interleave(hq // hkv, 1)
    i = torch.arange(n, device=q.device)[:, None]
    j = pos[None, :]
    mask = None if cb is None else (j < start) | ((j - start) // cb <= i // cb)
    out = F.scaled_dot_product_attention(q.double().transpose(0, 1), k.transpose(0, 1),
                                         v.transpose(0, 1), attn_mask=mask, scale=d**-0.5)
    return out.transpose(0, 1)


CASES = [  # n, hq, hkv, d, page, start, chunk_block, splits, valid
    (4, 4, 2, 16, 16, 37, 4, 3, 4),
    (5, 4, 4, 32, 8, 0, None, 1, 5),
    (7, 8, 1, 16, 16, 50, 7, 4, 7),
    (4, 2, 1, 64, 4, 3, 2, 2, 4),
    (1, 4, 4, 16, 16, 64, 1, 8, 1),  # more splits than the context fills
    (64, 2, 2, 16, 16, 17, 64, 2, 64),
    (9, 4, 2, 128, 16, 100, 3, 5, 9),
    (12, 4, 4, 16, 16, 0, None, 4, 9),  # canvas padding: 3 rows past kv_len
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_kernel_matches_sdpa(case):
    n, hq, hkv, d, ps, start, cb, splits, valid = case
    gen = torch.Generator().manual_seed(hash(case) % 2**31)
    pages = -(-(start + n + 40) // ps)
    kc = torch.randn(pages, ps, hkv, d, generator=gen).to(DEV)
    vc = torch.randn(pages, ps, hkv, d, generator=gen).to(DEV)
    pt = torch.randperm(pages, generator=gen).to(torch.int32).to(DEV)
    q = torch.randn(n, hq, d, generator=gen).to(DEV)
    kv_len = start + valid
    lens = torch.tensor([start, kv_len], dtype=torch.int32, device=DEV)
    out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
    scratch = split_scratch(n, hq, d, splits, DEV)
    for t in scratch:  # poisoned: the merge reads only the splits that were written
        t.fill_(float("nan"))
    paged_chunk_attention(q, kc, vc, pt, lens, d**-0.5, cb, max_kv=pages * ps, splits=splits,
                          out=out, scratch=scratch)
    ref = reference(q, kc, vc, pt, start, kv_len, cb)
    rows = slice(0, valid)
    err = (out[rows].double() - ref[rows]).norm() / ref[rows].norm()
    assert err < 1e-4, err
    assert not torch.isnan(out[rows]).any()


def test_lengths_come_from_device_memory():
    """One launch configuration, two contexts: only `lens` changes between the calls."""
    gen = torch.Generator().manual_seed(7)
    kc = torch.randn(8, 16, 2, 16, generator=gen).to(DEV)
    vc = torch.randn(8, 16, 2, 16, generator=gen).to(DEV)
    pt = torch.arange(8, dtype=torch.int32, device=DEV)
    q = torch.randn(4, 4, 16, generator=gen).to(DEV)
    lens = torch.zeros(2, dtype=torch.int32, device=DEV)
    outs = []
    for start in (5, 90):
        lens.copy_(torch.tensor([start, start + 4]))
        outs.append(paged_chunk_attention(q, kc, vc, pt, lens, 0.25, 4, max_kv=128, splits=4))
        ref = reference(q, kc, vc, pt, start, start + 4, 4)
        assert (outs[-1].double() - ref).norm() / ref.norm() < 1e-4
    assert (outs[0] - outs[1]).abs().max() > 1e-3


@pytest.mark.gpu
def test_bf16_on_gpu():
    gen = torch.Generator(device="cuda").manual_seed(3)
    kc = torch.randn(600, 16, 8, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    pt = torch.randperm(600, device="cuda", generator=gen).to(torch.int32)
    q = torch.randn(4, 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    for start, splits in ((0, 64), (1000, 64), (4093, 64), (9000, 64), (4093, 7), (9000, 1)):
        lens = torch.tensor([start, start + 4], dtype=torch.int32, device="cuda")
        out = paged_chunk_attention(q, kc, vc, pt, lens, 128**-0.5, 4, max_kv=9600,
                                    splits=splits)
        ref = reference(q, kc, vc, pt, start, start + 4, 4)
        assert (out.double() - ref).norm() / ref.norm() < 2e-2


def test_split_choice():
    from dlrt.kernels.paged_attention import block_keys, default_splits

    cpu = torch.device("cpu")
    # 4 programs per "SM" (16 assumed) over 8 KV heads, one tile of 4 x 4 query rows
    assert default_splits(40960, 4, 32, 8, cpu) == 8
    assert default_splits(100, 4, 32, 8, cpu) == 2  # no more splits than 64-key tiles
    assert default_splits(40960, 4, 128, 128, cpu) == 1
    assert default_splits(40960, 288, 32, 32, cpu) == 1  # a canvas: 5 query tiles per head
    assert default_splits(40960, 288, 4, 1, cpu) == 1  # 18 query tiles cover the 16 SMs
    assert default_splits(40960, 40, 4, 1, cpu) == 16  # 3 query tiles: 64 // 3 = 21 -> 16
    assert default_splits(300, 4, 32, 8, cpu) == 4  # 5 tiles of 64 keys -> 4
    assert block_keys(10000, 4) == 64 and block_keys(128, 4) == 32 and block_keys(20, 8) == 16
