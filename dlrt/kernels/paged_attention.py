"""Chunk attention over a paged KV cache, split over the context (flash-decoding style).

Queries: a chunk of N tokens at positions start..start+N-1 whose K/V are already in the cache.
Keys: cache positions 0..kv_len-1, where `start` and `kv_len` are read from device memory, so
one launch configuration (and one captured CUDA graph) serves every context length up to the
cache capacity. Key j is visible to query i when j < kv_len and either j < start (the cached
prefix) or, inside the chunk, block(j) <= block(i) with blocks of CHUNK_BLOCK tokens counted from
the chunk start (CHUNK_BLOCK = 0: the whole chunk is visible, full bidirectional attention).

A sliding window W (WINDOW > 0; `dlrt.attention.base`) hides every key at or before p - W, where
p is the query's position (start + i) in a (block-)causal chunk and `start` in a full one (a
bidirectional canvas sees the W - 1 keys before it and all of itself). The context then starts
at max(0, start - W + 1): the splits share out only the keys from there, and in a causal chunk
each program also skips the keys before its first query's window and past its last query's
block (tiles that every row masks: the result is unchanged), so a windowed layer reads about
W + N keys at any context length.

The chunk's own K/V may come beside the cache instead of in it (CHUNK_KV: chunk_k, chunk_v
[N, Hkv, D], a forward that writes nothing to the cache, DiffusionGemma's decoder): keys from
`start` on are then read from them, and the cache is read only below `start`.

GQA: one program serves all query heads of one KV head, so each K/V tile is read once per
group. The context is cut into a fixed number of splits that run in parallel (so a block of 4
queries still fills the GPU); each split's length follows the context read from device memory
(whole tiles of BLOCK_N keys), so short and long contexts alike spread over the splits. A second
kernel merges the splits' partial softmax states. Algorithm: FlashAttention's
online softmax (Dao et al., 2022) with split-K merging as in Flash-Decoding (Dao et al., 2023).

An FP8 cache (float8_e4m3fn, K and V stored divided by the layer's k_scale / v_scale): tiles
are loaded in FP8 (half the bytes of BF16) and converted to q's dtype in registers (exact);
k_scale is folded into the softmax scale and v_scale into each split's output, both read from
device memory, so one captured graph serves any scale. With bf16 q both dots run on fp16
operands instead, since e4m3 -> fp16 is one packed instruction per two values and e4m3 ->
bf16 three per value: each query row is scaled by a power of two into fp16's range
(`dlrt.kernels.e4m3.f16_rows`, exact for all but values below 2^-28 of the row's largest;
the factor is taken out of the row's softmax scale), and p (in [0, 1]) enters the PV dot as
p * 2^14 in fp16 (11 significant bits where bf16 has 8; values down to 2^-38 kept), the
split's output scaled back by 2^-14.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.e4m3 import f16_rows


@triton.jit
def _load_kv(k_ptr, v_ptr, page_table_ptr, ck_ptr, cv_ptr, j0, hi, start, kvh,
             H_KV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
             CHUNK_KV: tl.constexpr):
    """The K and V tiles [BLOCK_N, D] of keys j0.. (zeros at keys >= hi: no reads): stored in
    the cache, or with CHUNK_KV from `start` on the chunk's own (ck, cv: [N, H_KV, D])."""
    d = tl.arange(0, D)
    j = j0 + tl.arange(0, BLOCK_N)
    j_ok = j < hi
    cached = j_ok
    if CHUNK_KV:
        cached = j_ok & (j < start)
    page = tl.load(page_table_ptr + j // PAGE, mask=cached, other=0)
    slot = page.to(tl.int64) * PAGE + j % PAGE
    kv_off = (slot[:, None] * H_KV + kvh) * D + d[None, :]
    k_src = k_ptr + kv_off
    v_src = v_ptr + kv_off
    if CHUNK_KV:  # NOTE: one load per tile from either source (one pipelined buffer each)
        c_off = ((j - start).to(tl.int64)[:, None] * H_KV + kvh) * D + d[None, :]
        k_src = tl.where(cached[:, None], k_src, ck_ptr + c_off)
        v_src = tl.where(cached[:, None], v_src, cv_ptr + c_off)
    k = tl.load(k_src, mask=j_ok[:, None], other=0.0)
    v = tl.load(v_src, mask=j_ok[:, None], other=0.0)
    return k, v


@triton.jit
def _tile(q, k, v, j0, hi, start, i, row_ok, m, s_sum, acc, scale, CHUNK_BLOCK: tl.constexpr,
          WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
          P_UP: tl.constexpr):
    """One tile of BLOCK_N keys from j0 (k, v: `_load_kv`'s tiles): the online-softmax update
    of (m, s_sum, acc). scale: the softmax scale of each row [BLOCK_M]; P_UP: p's factor in the
    PV dot (a power of two; acc holds sum p v times it)."""
    j = j0 + tl.arange(0, BLOCK_N)
    j_ok = j < hi
    # NOTE: a no-op unless the cache is FP8: e4m3 converts exactly to bf16/fp16/fp32
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale[:, None]
    visible = j_ok[None, :] & row_ok[:, None]
    if CHUNK_BLOCK > 0:
        inner = (j[None, :] - start) // CHUNK_BLOCK <= i[:, None] // CHUNK_BLOCK
        visible = visible & ((j[None, :] < start) | inner)
        if WINDOW > 0:  # NOTE: a full chunk's window is its context start (no key below it)
            visible = visible & (j[None, :] > start + i[:, None] - WINDOW)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m - m_safe)
    s_sum = s_sum * alpha + tl.sum(p, axis=1)
    if P_UP != 1.0:
        p = p * P_UP
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v,
                                        input_precision=PRECISION).to(tl.float32)
    return m_new, s_sum, acc


@triton.jit
def _split_len(keys, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys per split for a context of `keys` keys: whole tiles, at least one."""
    return tl.maximum(tl.cdiv(tl.cdiv(keys, SPLITS), BLOCK_N), 1) * BLOCK_N


@triton.jit
def _context_start(start, WINDOW: tl.constexpr):
    """The first key any query of the chunk may see: 0, or start - W + 1 with a window."""
    first = start * 0
    if WINDOW > 0:
        first = tl.maximum(start - WINDOW + 1, 0)
    return first


@triton.jit
def _attn_split_kernel(
    q_ptr, k_ptr, v_ptr, page_table_ptr, lens_ptr,
    part_o_ptr, part_ml_ptr, k_scale_ptr, v_scale_ptr, ck_ptr, cv_ptr,
    scale, N,
    H_Q: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    CHUNK_BLOCK: tl.constexpr, WINDOW: tl.constexpr, CHUNK_KV: tl.constexpr,
    SPLITS: tl.constexpr, MAX_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    KV_SCALED: tl.constexpr, DYNAMIC_TRIPS: tl.constexpr, PDL: tl.constexpr,
):
    pdl.begin(PDL)
    G: tl.constexpr = H_Q // H_KV
    pid_m = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(lens_ptr)
    kv_len = tl.load(lens_ptr + 1)
    ctx_lo = _context_start(start, WINDOW)
    span = _split_len(kv_len - ctx_lo, SPLITS, BLOCK_N)
    lo = ctx_lo + split * span
    hi = tl.minimum(lo + span, kv_len)
    if lo >= kv_len:  # a split past the context: the merge ignores it
        return
    if CHUNK_BLOCK > 0:  # keys no row of this program sees (every tile of them masked)
        hi = tl.minimum(hi, start + ((pid_m * BLOCK_M + BLOCK_M - 1) // G // CHUNK_BLOCK + 1)
                        * CHUNK_BLOCK)
        if WINDOW > 0:
            lo = tl.maximum(lo, start + (pid_m * BLOCK_M) // G - WINDOW + 1)
    if KV_SCALED:  # scores of the stored keys: q . k_stored * (scale * k_scale)
        scale = scale * tl.load(k_scale_ptr)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # flattened (query i, head-in-group g)
    i = rows // G
    head = kvh * G + rows % G
    row_ok = i < N
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (i[:, None] * H_Q + head[:, None]) * D + d[None, :],
                mask=row_ok[:, None], other=0.0)
    F16: tl.constexpr = KV_SCALED and q.dtype == tl.bfloat16  # fp16 operands (docstring)
    P_UP: tl.constexpr = 16384.0 if F16 else 1.0
    scale = tl.zeros([BLOCK_M], tl.float32) + scale  # one per row
    if F16:
        q, down = f16_rows(q)
        scale = scale * down
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # NOTE: on the GPU the trip count follows the context (read from device memory); the
    # interpreter needs a static count (MAX_TILES: the split length at the largest context).
    # Keys past `hi` are masked either way.
    trips = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N) if DYNAMIC_TRIPS else MAX_TILES
    for t in range(0, trips):  # the loads feed the dots (Triton pipelines them in smem)
        j0 = lo + t * BLOCK_N
        k, v = _load_kv(k_ptr, v_ptr, page_table_ptr, ck_ptr, cv_ptr, j0, hi, start, kvh,
                        H_KV, D, PAGE, BLOCK_N, CHUNK_KV)
        m, s_sum, acc = _tile(q, k, v, j0, hi, start, i, row_ok, m, s_sum, acc, scale,
                              CHUNK_BLOCK, WINDOW, BLOCK_N, PRECISION, P_UP)
    if KV_SCALED:  # sum_j p_j v_j = v_scale * sum_j p_j v_stored_j
        acc = acc * (tl.load(v_scale_ptr) * (1.0 / P_UP))
    out_row = (split * N * H_Q + i * H_Q + head)
    tl.store(part_o_ptr + out_row[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
    tl.store(part_ml_ptr + out_row * 2, m, mask=row_ok)
    tl.store(part_ml_ptr + out_row * 2 + 1, s_sum, mask=row_ok)


@triton.jit
def _attn_merge_kernel(part_o_ptr, part_ml_ptr, lens_ptr, out_ptr, NH,
                       D: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                       BLOCK_N: tl.constexpr, WINDOW: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0)  # flattened (query, head)
    kv_len = tl.load(lens_ptr + 1)
    ctx_lo = _context_start(tl.load(lens_ptr), WINDOW)
    s = tl.arange(0, SPLITS_P2)
    used = (s < SPLITS) & (ctx_lo + s * _split_len(kv_len - ctx_lo, SPLITS, BLOCK_N) < kv_len)
    d = tl.arange(0, D)
    base = s * NH + row
    m = tl.load(part_ml_ptr + base * 2, mask=used, other=float("-inf"))
    w_sum = tl.load(part_ml_ptr + base * 2 + 1, mask=used, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.where(used, tl.exp(m - m_all), 0.0)
    acc = tl.load(part_o_ptr + base[:, None] * D + d[None, :], mask=used[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(w * w_sum, axis=0)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty))


HEAD_DIMS = (16, 32, 64, 128, 256, 512)  # D the kernel serves (powers of two)


def _block_rows(rows: int, d: int = 128) -> int:
    """Query rows per program (BLOCK_M): 16 for a few rows, else 64 (32 at D = 512, whose
    fp32 accumulator would not fit the registers of 64 rows)."""
    return 16 if rows <= 16 else 64 if d <= 256 else 32


def block_keys(max_kv: int, splits: int, d: int = 128) -> int:
    """Keys per tile (BLOCK_N): 64 (32 at D = 512: a K and a V tile per pipeline stage in
    shared memory), or less when a split never holds that many keys."""
    return max(16, min(64 if d <= 256 else 32,
                       triton.next_power_of_2(triton.cdiv(max_kv, splits))))


def split_warps(fp8: bool, d: int = 128) -> int:
    """Warps per split program. Measured on an H200 (SDAR-8B heads, 4 queries, 32k keys,
    `benchmarks/device/sweep_fp8.py`): an FP8 cache takes 39.8 us a layer with 2 warps
    against 52.5 us with 4; BF16 44.6 us with 4, 42.6 with 2 (kept at 4). D >= 256: 8, the
    fewest whose registers hold the tiles without spilling (sm_90 build,
    `tests/kernels/test_attention_resources.py`)."""
    if d >= 256:
        return 8
    return 2 if fp8 else 4


def split_stages(d: int = 128) -> int:
    """Pipeline stages of the split program's loop: 3, 2 for D >= 256 (shared memory and
    registers, as `split_warps`)."""
    return 3 if d < 256 else 2


def _launch(q, k_cache, v_cache, page_table, lens, scale, chunk_block, max_kv, splits,
            out, scratch, k_scale, v_scale, block_n=None, warps=None, stages=None,
            window=None, chunk_k=None, chunk_v=None, block_m=None):
    """block_m (None: `_block_rows`), block_n (None: `block_keys`), warps (None:
    `split_warps`), stages (None: `split_stages`): the split kernel's launch (arguments for
    the benchmarks' sweeps)."""
    n, h_q, d = q.shape
    _, page, h_kv, _ = k_cache.shape
    assert q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    scaled = k_cache.dtype == torch.float8_e4m3fn
    assert v_cache.dtype == k_cache.dtype and (scaled or k_cache.dtype == q.dtype), \
        (q.dtype, k_cache.dtype, v_cache.dtype)
    assert not scaled or (k_scale is not None and v_scale is not None)
    assert h_q % h_kv == 0 and d in HEAD_DIMS, (h_q, h_kv, d)
    fresh = chunk_k is not None
    if fresh:  # the chunk's own K/V: q's dtype (never with an FP8 cache), [N, Hkv, D]
        assert not scaled and chunk_v is not None
        for t in (chunk_k, chunk_v):
            assert t.shape == (n, h_kv, d) and t.dtype == q.dtype and t.is_contiguous(), \
                (t.shape, t.dtype)
    assert window is None or window > 0, window
    g = h_q // h_kv
    block_m = block_m or _block_rows(n * g, d)
    block_n = block_n or block_keys(max_kv, splits, d)
    warps = warps or split_warps(scaled, d)
    stages = stages or split_stages(d)
    part_o, part_ml = scratch
    assert part_o.numel() >= splits * n * h_q * d
    assert part_ml.numel() >= splits * n * h_q * 2
    grid = (triton.cdiv(n * g, block_m), h_kv, splits)
    opts = pdl.launch_options(q)
    _attn_split_kernel[grid](q, k_cache, v_cache, page_table, lens, part_o, part_ml,
                             k_scale if scaled else lens, v_scale if scaled else lens,
                             chunk_k if fresh else q, chunk_v if fresh else q, scale, n,
                             H_Q=h_q, H_KV=h_kv, D=d, PAGE=page, CHUNK_BLOCK=chunk_block or 0,
                             WINDOW=window or 0, CHUNK_KV=fresh,
                             SPLITS=splits, BLOCK_M=block_m, BLOCK_N=block_n,
                             MAX_TILES=triton.cdiv(triton.cdiv(max_kv, splits), block_n),
                             PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                             KV_SCALED=scaled,
                             DYNAMIC_TRIPS=os.environ.get("TRITON_INTERPRET") != "1",
                             num_warps=warps, num_stages=stages, **opts)
    _attn_merge_kernel[(n * h_q,)](part_o, part_ml, lens, out, n * h_q, D=d, SPLITS=splits,
                                   SPLITS_P2=triton.next_power_of_2(splits), BLOCK_N=block_n,
                                   WINDOW=window or 0, **opts)
    return out


def split_scratch(n: int, h_q: int, d: int, splits: int,
                  device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for partial results: ([splits, n, Hq, D] fp32, [splits, n, Hq, 2] fp32)."""
    return (torch.empty(splits * n * h_q * d, dtype=torch.float32, device=device),
            torch.empty(splits * n * h_q * 2, dtype=torch.float32, device=device))


def default_splits(max_kv: int, n: int, h_q: int, h_kv: int, device: torch.device,
                   d: int = 128) -> int:
    """Splits of the context for n queries of head size d. One when the query tiles times
    the KV heads already cover the SMs (a LLaDA canvas); else about four programs per SM (at
    most 64 splits), and no more than there are tiles of 64 keys at the largest context;
    rounded down to a power of two, so prefills of any prompt length compile few kernel
    variants."""
    sms = (torch.cuda.get_device_properties(device).multi_processor_count
           if device.type == "cuda" else 16)
    q_tiles = triton.cdiv(n * (h_q // h_kv), _block_rows(n * (h_q // h_kv), d))
    if q_tiles * h_kv >= sms:
        return 1
    splits = max(1, min(64, 4 * sms // (h_kv * q_tiles), triton.cdiv(max_kv, 64)))
    return 1 << (splits.bit_length() - 1)


def paged_chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          page_table: torch.Tensor, lens: torch.Tensor, scale: float,
                          chunk_block: int | None, max_kv: int, splits: int = 16,
                          out: torch.Tensor | None = None,
                          scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
                          k_scale: torch.Tensor | None = None,
                          v_scale: torch.Tensor | None = None, window: int | None = None,
                          chunk_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                          ) -> torch.Tensor:
    """Attention of a chunk of queries over a paged KV cache (see module docstring).

    Args:
        q: [N, Hq, D] (bf16/fp16/fp32; fp32 products in full fp32, not TF32), RoPE applied;
            Hq a multiple of Hkv; D a power of two in 16..512.
        k_cache, v_cache: [num_pages, page_size, Hkv, D], one layer, q's dtype, or
            float8_e4m3fn (an FP8 cache: keys are k_cache * k_scale, values v_cache * v_scale;
            sm_89+ on the GPU).
        page_table: [num_pages] int32, page of each logical page index.
        lens: [2] int32 on the device: (start, kv_len) — chunk start and visible key count.
        scale: softmax scale. chunk_block: block-causal block length inside the chunk, or None.
        max_kv: upper bound of the context's keys: kv_len, or with a window kv_len - max(0,
            start - W + 1) (at most W - 1 + N). splits: programs along the context (fixes
            the grid with max_kv); each takes ceil(keys / splits) keys rounded up to whole
            tiles.
        out: optional [N, Hq, D] output; scratch: optional `split_scratch(...)` buffers.
        k_scale, v_scale: FP8 caches only: fp32 scalar tensors ([] or [1]) on the device.
        window: the layer's sliding window W (keys), or None.
        chunk_kv: (k, v) [N, Hkv, D] in q's dtype: the chunk's own K/V, not in the cache
            (keys start.. come from them; kv_len <= start + N); not with an FP8 cache.
    Returns:
        [N, Hq, D] in q.dtype. Rows of queries that see no key are undefined.
    Raises:
        ValueError: an FP8 cache without its scales; chunk_kv with an FP8 cache; window < 1.
    """
    n, h_q, d = q.shape
    if k_cache.dtype == torch.float8_e4m3fn and (k_scale is None or v_scale is None):
        raise ValueError("an FP8 KV cache is read with its k_scale and v_scale")
    if chunk_kv is not None and k_cache.dtype == torch.float8_e4m3fn:
        raise ValueError("chunk_kv (the chunk's K/V beside the cache) is not served with an "
                         "FP8 KV cache")
    if window is not None and window < 1:
        raise ValueError(f"window: a sliding window of at least 1 key; got {window}")
    if out is None:
        out = torch.empty_like(q)
    if scratch is None:
        scratch = split_scratch(n, h_q, d, splits, q.device)
    chunk_k, chunk_v = (None, None) if chunk_kv is None else chunk_kv
    return _launch(q, k_cache, v_cache, page_table, lens, scale, chunk_block, max_kv, splits,
                   out, scratch, k_scale, v_scale, window=window, chunk_k=chunk_k,
                   chunk_v=chunk_v)
