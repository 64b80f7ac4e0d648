"""Sampled candidates from logits without sorting the vocabulary (temperature, top-k, top-p).

The same draw as `dlrt.decoding.sampling` (SDAR `generate.py` order: logits / T, top-k, top-p,
softmax, then the exponential race with counter-based noise, `dlrt.decoding.rng`), without the
fp32 [n, V] probabilities, the full-vocabulary sort of top-p or the int64 noise tensors.

Both filters are thresholds on the logit:
  - top-k keeps every logit >= the k-th largest (ties at the k-th value all kept, as the
    reference's `logits < kth` does);
  - top-p keeps every logit > t and, of the logits equal to t, the first ones in token-id
    order while the mass before each stays <= p (the reference's cumulative sum over a stable
    sort), where t is the smallest logit whose strictly larger logits hold mass <= p.
Each threshold is found by a radix search over the 32-bit order-preserving key of the fp32
logit: 8 passes, each fixing 4 bits by summing, for 16 probe keys, the count (top-k) or the
softmax mass (top-p) of the logits above each probe. A pass is one launch over (row, vocabulary
slice) programs that add their sums into the row's in fixed point (int64 atomics: the total
does not depend on the order programs finish in); every program of the next launch reads them
to fix the digit, so the row is spread over the GPU and no program waits on another. The last
launch draws the race (argmax of p_v / -log u_v over the kept tokens) per slice and a merge
picks the first best token id, as `torch.argmax` does.

A token id to exclude (the mask token; a runtime argument, not a constexpr) reads as -inf
wherever the kernels load a logit. A NaN or +inf logit makes its row's confidence NaN (the
race's kept mass is NaN), whatever the filters kept.

Numerics: fp32 per element, the row sums in 2^-32 fixed point. Which tokens survive is exact
except where a cumulative mass lies within fp32 rounding of p; the race's winner can differ
from the reference only where two scores are within a few ulps (exp/log approximations).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl

PASSES = 8  # 4 bits of the 32-bit key fixed per pass (16 probes)
BLOCK = 512  # logits per program per step
NUM_WARPS = 4
CHUNKS = 5  # blocks per program (about 60 programs per row at V = 151936)
SCALE: tl.constexpr = tl.constexpr(2.0**32)  # fixed point of the row sums (exact for counts)


@triton.jit
def _key(x):
    """fp32 -> uint32 with the same order (-0.0 and 0.0 share a key)."""
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _value(k):
    """Inverse of `_key`."""
    b = tl.where((k >> 31) != 0, k ^ 0x80000000, k ^ 0xFFFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def noise_key(seed_ptr, round_ptr, pos_ptr, row):
    """`rng.position_keys(seed, rng.SAMPLE_STREAM, round, position)` of one row (stream 0)."""
    seed = tl.load(seed_ptr)
    k = _mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ _mix32((seed >> 32).to(tl.uint32)))
    k = _mix32(_mix32(k) + tl.load(round_ptr).to(tl.uint32))
    return _mix32(k + tl.load(pos_ptr + row).to(tl.uint32))


@triton.jit
def race_uniform(key, v):
    """`rng.uniform(...)[row, v]` in (0, 1), fp32, for token ids v of the row whose
    `noise_key` is `key`."""
    h = _mix32(key + v.to(tl.uint32) * 0x9E3779B9)
    # NOTE: at most 1 - 2^-24 (`rng.BELOW_ONE`): the top value rounds to 1.0 in fp32
    return tl.minimum(((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), 0.99999994)


@triton.jit
def neg_log(u):
    """-log(u) of fp32 u in (0, 1), accurate near 1 too. tl.log is a fast approximation with an
    absolute error near 2^-22: most of -log(u) where u is within 2^-20 of 1, as a quarter of
    a 262144-token row's race draws are, so such a token's race score would be far off. Below
    d = 1 - u = 2^-6 (exact in fp32) the series d + d^2/2 + d^3/3 + d^4/4 is used (relative
    error under 2^-26)."""
    d = 1.0 - u
    series = d * (1.0 + d * (0.5 + d * (1.0 / 3.0 + d * 0.25)))
    return tl.where(d < 0.015625, series, -tl.log(u))


@triton.jit
def _row_max(stats_ptr, row, nsl, SLICES: tl.constexpr):
    s = tl.arange(0, SLICES)
    return tl.max(tl.load(stats_ptr + row * SLICES + s, mask=s < nsl, other=float("-inf")),
                  axis=0)


@triton.jit
def _search(acc_ptr, row, first, passes, target):
    """The key prefix fixed by `passes` finished passes (from pass index `first`) and f(prefix),
    the sum at the chosen probe of the last one (fp64, in units of the search)."""
    d16 = tl.arange(0, 16)
    prefix = tl.zeros([], tl.uint32)
    f = tl.zeros([], tl.float64)
    for i in tl.static_range(8):  # passes past `passes` leave the prefix as it is
        live = (d16 * 0 + i) < passes  # [16] bool: a tensor mask under every Triton version
        done = tl.max(live.to(tl.int32), axis=0) > 0
        acc = tl.load(acc_ptr + (row * 16 + first + i) * 16 + d16, mask=live, other=0)
        acc = acc.to(tl.float64) * (1.0 / SCALE)
        d = tl.min(tl.where(acc <= target, d16, 15), axis=0)  # 15 always qualifies
        f = tl.where(done, tl.sum(tl.where(d16 == d, acc, 0.0), axis=0), f)
        prefix = tl.where(done, prefix | (d.to(tl.uint32) << (28 - 4 * i)), prefix)
    return prefix, f


@triton.jit
def _thresholds(stats_ptr, acc_ptr, zk_ptr, row, nsl, kk, top_p, passes,
                SLICES: tl.constexpr, USE_K: tl.constexpr, USE_P: tl.constexpr):
    """(row max, top-k key, top-p prefix key, f at it, p * Z) from the finished passes;
    `passes` counts the top-p passes done. Counts are scaled like masses (exact in int64)."""
    lmax = _row_max(stats_ptr, row, nsl, SLICES)
    t_k = tl.zeros([], tl.uint32)
    if USE_K:
        t_k, _f = _search(acc_ptr, row, 0, 8, kk)
    t_p = tl.zeros([], tl.uint32)
    f = tl.zeros([], tl.float64)
    pz = tl.zeros([], tl.float64)
    if USE_P:
        pz = top_p * tl.load(zk_ptr + row).to(tl.float64) * (1.0 / SCALE)
        t_p, f = _search(acc_ptr, row, 8 if USE_K else 0, passes, pz)
    return lmax, t_k, t_p, f, pz


@triton.jit
def _request(t_ptr, k_ptr, p_ptr, V):
    """The request's values from device memory: 1 / temperature (fp64 -> fp32, as a host
    division would round it), top-k minus one as fp32 (the k-th largest is the search target)
    and top-p (fp32)."""
    inv_t = (1.0 / tl.load(t_ptr)).to(tl.float32)
    kk = (tl.minimum(tl.load(k_ptr), V) - 1).to(tl.float32)
    return inv_t, kk, tl.load(p_ptr)


@triton.jit
def _block(logits_ptr, row, V, start, exclude, BLOCK: tl.constexpr):
    """One block of a row: ids, in-vocabulary mask, fp32 logits (-inf past V and at
    `exclude`), their keys."""
    v = start + tl.arange(0, BLOCK)
    inb = v < V
    x = tl.load(logits_ptr + row * V + v, mask=inb, other=float("-inf")).to(tl.float32)
    x = tl.where(v == exclude, float("-inf"), x)
    return v, inb, x, _key(x)


@triton.jit
def _max_kernel(logits_ptr, stats_ptr, acc_ptr, zk_ptr, V, nsl, exclude, SLICE: tl.constexpr,
                SLICES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Slice maxima; the first slice of a row also zeroes the row's search sums."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for t in range(0, SLICE // BLOCK):
        v = sl * SLICE + t * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * V + v, mask=v < V, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, tl.where(v == exclude, float("-inf"), x))
    tl.store(stats_ptr + row * SLICES + sl, tl.max(m, axis=0))
    if sl == 0:
        tl.store(acc_ptr + row * 256 + tl.arange(0, 256), tl.zeros([256], tl.int64))
        tl.store(zk_ptr + row, tl.zeros([], tl.int64))


@triton.jit
def _pass_kernel(logits_ptr, stats_ptr, acc_ptr, zk_ptr, ties_ptr, V, nsl, t_ptr, k_ptr, p_ptr, j,
                 exclude, SLICE: tl.constexpr, SLICES: tl.constexpr, BLOCK: tl.constexpr,
                 MASS: tl.constexpr, USE_K: tl.constexpr, PDL: tl.constexpr):
    """Pass j of one search: for 16 probes, the count (MASS False: top-k) or the mass
    exp((l - max) / T) of the top-k survivors (MASS: top-p) of the slice's logits whose key
    exceeds the probe, added to the row's sums in fixed point (int64 atomics, so the sums do
    not depend on the order the programs finish in). The first top-p pass also sums the
    survivors' mass; the last one stores the slice's count of logits equal to each probe
    (ties at the top-p cut)."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    d16 = tl.arange(0, 16)
    inv_t, kk, top_p = _request(t_ptr, k_ptr, p_ptr, V)
    if MASS:
        lmax, t_k, prefix, _f, _pz = _thresholds(stats_ptr, acc_ptr, zk_ptr, row, nsl, kk,
                                                 top_p, j, SLICES, USE_K, True)
        out = (8 if USE_K else 0) + j
    else:
        prefix, _f = _search(acc_ptr, row, 0, j, kk)
        out = j
    shift = tl.zeros([], tl.uint32) + (28 - 4 * j)
    probes = prefix | (d16.to(tl.uint32) << shift) | ((tl.full([], 1, tl.uint32) << shift) - 1)
    # [probe, element] sums, reduced once after the loop
    acc = tl.zeros([16, BLOCK], tl.float32)
    ties = tl.zeros([16, BLOCK], tl.float32)
    z = tl.zeros([BLOCK], tl.float32)
    for t in range(0, SLICE // BLOCK):
        v, inb, x, key = _block(logits_ptr, row, V, sl * SLICE + t * BLOCK, exclude, BLOCK)
        if MASS:
            ok = inb
            if USE_K:
                ok = ok & (key >= t_k)
            w = tl.where(ok, tl.exp((x - lmax) * inv_t), 0.0)
            z += w
            if j == 7:
                ties += tl.where(ok[None, :] & (key[None, :] == probes[:, None]), 1.0, 0.0)
        else:
            w = tl.where(inb, 1.0, 0.0)
        acc += tl.where(key[None, :] > probes[:, None], w[None, :], 0.0)
    sums = (tl.sum(acc, axis=1) * SCALE).to(tl.int64)
    tl.atomic_add(acc_ptr + (row * 16 + out) * 16 + d16, sums, sem="relaxed")
    if MASS:
        if j == 0:
            tl.atomic_add(zk_ptr + row, (tl.sum(z, axis=0) * SCALE).to(tl.int64), sem="relaxed")
        if j == 7:
            tl.store(ties_ptr + (row * SLICES + sl) * 16 + d16, tl.sum(ties, axis=1))


@triton.jit
def _race_kernel(logits_ptr, seed_ptr, round_ptr, pos_ptr, stats_ptr, acc_ptr, zk_ptr, ties_ptr,
                 race_ptr, race_idx_ptr, V, nsl, t_ptr, k_ptr, p_ptr, exclude,
                 SLICE: tl.constexpr, SLICES: tl.constexpr, BLOCK: tl.constexpr,
                 USE_K: tl.constexpr, USE_P: tl.constexpr, PDL: tl.constexpr):
    """Per slice: the kept tokens' race winner (score w / -log u, first id on ties), its
    weight and the kept mass (NaN if the slice holds a NaN or +inf logit)."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    inv_t, kk, top_p = _request(t_ptr, k_ptr, p_ptr, V)
    lmax, t_k, t_p, f, pz = _thresholds(stats_ptr, acc_ptr, zk_ptr, row, nsl, kk, top_p, 8,
                                        SLICES, USE_K, USE_P)
    keep_ties = tl.zeros([], tl.float64)  # how many logits equal to t_p are kept
    seen = tl.zeros([], tl.float32)  # of those, how many lie in earlier slices
    if USE_P:
        w_t = tl.exp((_value(t_p) - lmax) * inv_t).to(tl.float64)
        keep_ties = tl.floor((pz - f) / w_t) + 1.0
        s_all = tl.arange(0, SLICES)
        digit = (t_p & 15).to(tl.int32)
        tie_counts = tl.load(ties_ptr + (row * SLICES + s_all) * 16 + digit, mask=s_all < nsl,
                             other=0.0)
        seen = tl.sum(tl.where(s_all < sl, tie_counts, 0.0), axis=0)
    key0 = noise_key(seed_ptr, round_ptr, pos_ptr, row)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_w = tl.zeros([BLOCK], tl.float32)
    idx = tl.zeros([BLOCK], tl.int32)
    z = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    for t in range(0, SLICE // BLOCK):
        v, inb, x, key = _block(logits_ptr, row, V, sl * SLICE + t * BLOCK, exclude, BLOCK)
        bad = tl.maximum(bad, (inb & ((x != x) | (x == float("inf")))).to(tl.int32))
        kept = inb
        if USE_K:
            kept = kept & (key >= t_k)
        if USE_P:
            tie = kept & (key == t_p)
            rank = seen + tl.cumsum(tie.to(tl.float32), axis=0) - 1.0
            seen += tl.sum(tie.to(tl.float32), axis=0)
            kept = kept & ((key > t_p) | (tie & (rank < keep_ties)))
        w = tl.where(kept, tl.exp((x - lmax) * inv_t), 0.0)
        z += w
        u = race_uniform(key0, v)
        score = tl.where(kept, w / neg_log(u), -1.0)
        better = score > best  # strict: the earlier id wins ties
        idx = tl.where(better, v, idx)
        best_w = tl.where(better, w, best_w)
        best = tl.where(better, score, best)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, idx, 2147483647), axis=0)
    out = row * SLICES + sl
    tl.store(race_ptr + out * 3, top)
    tl.store(race_ptr + out * 3 + 1,
             tl.max(tl.where((idx == first) & (best == top), best_w, 0.0), axis=0))
    tl.store(race_ptr + out * 3 + 2,
             tl.where(tl.max(bad, axis=0) > 0, float("nan"), tl.sum(z, axis=0)))
    tl.store(race_idx_ptr + out, first)


@triton.jit
def _pick_kernel(race_ptr, race_idx_ptr, ids_ptr, conf_ptr, nsl, SLICES: tl.constexpr,
                 PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SLICES)
    real = s < nsl
    score = tl.load(race_ptr + (row * SLICES + s) * 3, mask=real, other=-2.0)
    w = tl.load(race_ptr + (row * SLICES + s) * 3 + 1, mask=real, other=0.0)
    z = tl.sum(tl.load(race_ptr + (row * SLICES + s) * 3 + 2, mask=real, other=0.0), axis=0)
    idx = tl.load(race_idx_ptr + row * SLICES + s, mask=real, other=2147483647)
    top = tl.max(score, axis=0)
    first = tl.min(tl.where(score == top, idx, 2147483647), axis=0)
    w_first = tl.max(tl.where(idx == first, w, 0.0), axis=0)
    tl.store(ids_ptr + row, first.to(tl.int64))
    tl.store(conf_ptr + row, w_first / z)


def _layout(v: int) -> tuple[int, int]:
    """(vocabulary slices per row, logits per slice): CHUNKS blocks per program, the fastest
    layout measured on the H200 (a sweep, in benchmarks/README.md: fewer programs leave the
    GPU idle, more contend for the row sums' atomics)."""
    slice_len = min(CHUNKS, triton.cdiv(v, BLOCK)) * BLOCK
    return triton.cdiv(v, slice_len), slice_len


def device_scalar(x, dtype: torch.dtype, dev) -> torch.Tensor:
    """x (a host number or a 0-d tensor) as a [1] tensor of `dtype` on `dev`."""
    if torch.is_tensor(x):
        return x.to(dev, dtype).reshape(1)
    return torch.full((1,), x, dtype=dtype, device=dev)  # a fill: capturable, unlike a copy


def sample_candidates(logits: torch.Tensor, temperature, top_k, top_p, seed, round_idx,
                      positions: torch.Tensor, use_top_k: bool | None = None,
                      use_top_p: bool | None = None, exclude: int = -1
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled (candidate ids [n] int64, confidences [n] fp32) of logits [n, V], the token
    `exclude` (the mask token; -1: none) never drawn. A row with a NaN or +inf logit gets a NaN
    confidence.

    Args:
        logits: [n, V] contiguous, any float dtype (computed in fp32).
        temperature (> 0; fp64 on the device), top_k (0 = off; int64), top_p (in (0, 1],
            1 = off; fp32): host numbers, or 0-d device tensors that a captured graph reads
            when it runs (then `use_top_k` and `use_top_p` say which filters run).
        seed, round_idx: ints or 0-d int64 device tensors (inside a captured graph).
        positions: [n] int64 absolute positions. Token v of row i races with the uniform
            `rng.uniform(seed, rng.SAMPLE_STREAM, round_idx, positions, V)[i, v]`.
    Raises:
        ValueError: logits not a contiguous 2-D tensor, positions not [n], a host option out
            of range, or device values without `use_top_k` / `use_top_p`.
    """
    if logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(f"sample_candidates expects contiguous [n, V] logits, got "
                         f"{tuple(logits.shape)}")
    n, v = logits.shape
    if positions.shape != (n,):
        raise ValueError(f"positions must be [{n}], got {tuple(positions.shape)}")
    if use_top_k is None or use_top_p is None:
        if any(torch.is_tensor(x) for x in (temperature, top_k, top_p)):
            raise ValueError("sample_candidates: device values need use_top_k and use_top_p")
        if not temperature > 0 or top_k < 0 or not 0 < top_p <= 1:
            raise ValueError(f"need temperature > 0, top_k >= 0, top_p in (0, 1]; got "
                             f"{temperature}, {top_k}, {top_p}")
        use_top_k, use_top_p = top_k > 0, top_p < 1.0
    dev = logits.device
    values = (device_scalar(temperature, torch.float64, dev),
              device_scalar(top_k, torch.int64, dev), device_scalar(top_p, torch.float32, dev))
    nsl, slice_len = _layout(v)
    sp2 = triton.next_power_of_2(nsl)
    f32 = dict(dtype=torch.float32, device=dev)
    stats = torch.empty(n * sp2, **f32)
    acc = torch.empty(n * 256, dtype=torch.int64, device=dev)  # [row, pass, probe]
    zk = torch.empty(n, dtype=torch.int64, device=dev)
    ties = torch.empty(n * sp2 * 16, **f32)
    race = torch.empty(n * sp2 * 3, **f32)
    race_idx = torch.empty(n * sp2, dtype=torch.int32, device=dev)
    ids = torch.empty(n, dtype=torch.int64, device=dev)
    conf = torch.empty(n, **f32)
    opts = pdl.launch_options(logits)
    common = dict(SLICE=slice_len, SLICES=sp2, BLOCK=BLOCK, num_warps=NUM_WARPS, **opts)
    grid = (n, nsl)
    _max_kernel[grid](logits, stats, acc, zk, v, nsl, exclude, **common)
    for mass, on in ((False, use_top_k), (True, use_top_p)):
        for j in range(PASSES if on else 0):
            _pass_kernel[grid](logits, stats, acc, zk, ties, v, nsl, *values, j, exclude,
                               MASS=mass, USE_K=use_top_k, **common)
    _race_kernel[grid](logits, device_scalar(seed, torch.int64, dev),
                       device_scalar(round_idx, torch.int64, dev),
                       positions.to(torch.int64).contiguous(), stats, acc, zk, ties, race,
                       race_idx, v, nsl, *values, exclude, USE_K=use_top_k, USE_P=use_top_p,
                       **common)
    _pick_kernel[(n,)](race, race_idx, ids, conf, nsl, SLICES=sp2, num_warps=1, **opts)
    return ids, conf
