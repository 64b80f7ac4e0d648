"""The denoiser's draw of a renoising round (DiffusionGemma) straight from the logits: per row,
the entropy, the argmax and the race sample of softmax(logits / t), in one pass over the
vocabulary, without the fp32 [n, V] divided logits, probabilities or noise.

Per row of logits [n, V] and the round's temperature t (0-d fp32 on the device):
  x = logits / t in fp32 (an IEEE division, as PyTorch divides by a device tensor);
  entropy = log Z - S / Z nats, Z = sum_v exp(x_v - m), S = sum_v exp(x_v - m) (x_v - m), m the
      row's max: the Shannon entropy of softmax(x), as `Categorical(logits=x).entropy()`
      (a token at -inf adds nothing, as its clamped term does there);
  argmax of x, the first id on ties (`torch.argmax`);
  sample = argmax_v softmax(x)_v / -log(u_v), u = `rng.uniform(seed, SAMPLE_STREAM, round,
      positions, V)` made in the kernel from the counter-based noise of `dlrt.kernels.sampling`
      (`noise_key`, `race_uniform`): the exponential race of that kernel, the law of
      `torch.multinomial`, over the whole vocabulary (no filters), first id on ties;
  optionally x itself, written to `divided` in its dtype (the next round's self-conditioning
      signal), in the same pass.
Each program reduces a slice of one row online, like flash attention's softmax: a running max m,
the lane sums of exp(x - m) and exp(x - m)(x - m) rescaled by exp(m_old - m_new) when m grows,
the lane's best race score w / -log u relative to m (rescaled likewise) with its x and
-log u; a second kernel merges the slices (every sum moved to the row's max, the race scores
recomputed there as exp(x - m) / -log u). A NaN or +inf logit makes its row's entropy NaN.

Numerics: x equals the reference's bit for bit (an IEEE division, div.rn on the GPU; so do
the argmax and a written `divided`). The entropy's sums are fp32 in another order than
PyTorch's, and on the GPU exp / log are the hardware's approximations: on the CPU within
1e-6 (1 + H) nats of the fp64 entropy, closer than the fp32 reference itself (~1e-5 at V of a
few thousand). The sample can differ from the reference only where two race scores are
within a few fp32 ulps (the reference divides by Z before racing; exp and log
approximations; w / -log u an approximate division; scores compared against a running max
inside a slice).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl
from dlrt.kernels.sampling import device_scalar, neg_log, noise_key, race_uniform

BLOCK = 1024  # logits per program per step
CHUNKS = 4  # blocks per program
NUM_WARPS = 8
PARTS = 8  # fp32 values per (row, slice) record (see _slice_kernel)
_BIG = tl.constexpr(2147483647)


@triton.jit
def _first(v, idx):
    """(max of v, the lowest idx holding it)."""
    top = tl.max(v, axis=0)
    return top, tl.min(tl.where(v == top, idx, _BIG), axis=0)


@triton.jit
def _slice_kernel(logits_ptr, t_ptr, seed_ptr, round_ptr, pos_ptr, div_ptr, part_ptr,
                  part_idx_ptr, V, SLICE: tl.constexpr, SLICES: tl.constexpr,
                  BLOCK: tl.constexpr, WRITE: tl.constexpr, PDL: tl.constexpr):
    """One (row, slice): its record [m, Z, S, max x, the race winner's x and -log u, bad]
    relative to the slice max m, and the ids [argmax, race winner]."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    sl = tl.program_id(1)
    t = tl.load(t_ptr)
    key = noise_key(seed_ptr, round_ptr, pos_ptr, row)
    m = tl.full([], float("-inf"), tl.float32)
    z = tl.zeros([BLOCK], tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    top_idx = tl.zeros([BLOCK], tl.int32)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    best_x = tl.zeros([BLOCK], tl.float32)
    best_e = tl.full([BLOCK], 1.0, tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    for i in range(0, SLICE // BLOCK):
        v = sl * SLICE + i * BLOCK + tl.arange(0, BLOCK)
        inb = v < V
        x = tl.load(logits_ptr + row * V + v, mask=inb, other=float("-inf")).to(tl.float32)
        x = tl.div_rn(x, t)  # [BLOCK] fp32, the reference's logits / t
        if WRITE:
            tl.store(div_ptr + row * V + v, x.to(div_ptr.dtype.element_ty), mask=inb)
        bad = tl.maximum(bad, (inb & ((x != x) | (x == float("inf")))).to(tl.int32))
        better = x > top  # strict: the earlier id wins ties
        top_idx = tl.where(better, v, top_idx)
        top = tl.where(better, x, top)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # no NaN while the row is -inf
        alpha = tl.exp(m - base)
        shift = tl.where(m == float("-inf"), 0.0, m - base)
        w = tl.exp(x - base)  # 0 at -inf
        s = alpha * (s + shift * z) + w * tl.where(w > 0, x - base, 0.0)
        z = alpha * z + w
        best = tl.where(best > 0, best * alpha, best)
        m = m_new
        e = neg_log(race_uniform(key, v))
        score = tl.where(inb, w / e, -1.0)
        better = score > best
        best_idx = tl.where(better, v, best_idx)
        best_x = tl.where(better, x, best_x)
        best_e = tl.where(better, e, best_e)
        best = tl.where(better, score, best)
    top_max, top_first = _first(top, top_idx)
    best_max, best_first = _first(best, best_idx)
    won = (best_idx == best_first) & (best == best_max)
    out = part_ptr + (row * SLICES + sl) * 8
    tl.store(out, m)
    tl.store(out + 1, tl.sum(z, axis=0))
    tl.store(out + 2, tl.sum(s, axis=0))
    tl.store(out + 3, top_max)
    tl.store(out + 4, tl.max(tl.where(won, best_x, float("-inf")), axis=0))
    tl.store(out + 5, tl.max(tl.where(won, best_e, 0.0), axis=0))
    tl.store(out + 6, tl.max(bad, axis=0).to(tl.float32))
    tl.store(part_idx_ptr + (row * SLICES + sl) * 2, top_first)
    tl.store(part_idx_ptr + (row * SLICES + sl) * 2 + 1, best_first)


@triton.jit
def _merge_kernel(part_ptr, part_idx_ptr, sample_ptr, argmax_ptr, entropy_ptr, nsl,
                  SLICES: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, SLICES)
    real = k < nsl
    rec = part_ptr + (row * SLICES + k) * 8
    m = tl.load(rec, mask=real, other=float("-inf"))
    z = tl.load(rec + 1, mask=real, other=0.0)
    s = tl.load(rec + 2, mask=real, other=0.0)
    top = tl.load(rec + 3, mask=real, other=float("-inf"))
    best_x = tl.load(rec + 4, mask=real, other=float("-inf"))
    best_e = tl.load(rec + 5, mask=real, other=1.0)
    bad = tl.max(tl.load(rec + 6, mask=real, other=0.0), axis=0)
    top_idx = tl.load(part_idx_ptr + (row * SLICES + k) * 2, mask=real, other=_BIG)
    best_idx = tl.load(part_idx_ptr + (row * SLICES + k) * 2 + 1, mask=real, other=_BIG)
    m_all = tl.max(m, axis=0)
    c = tl.exp(m - m_all)  # 0 for a slice of -inf only; NaN for a row of -inf only
    total_z = tl.sum(tl.where(z > 0, z * c, 0.0), axis=0)
    total_s = tl.sum(tl.where(z > 0, (s + (m - m_all) * z) * c, 0.0), axis=0)
    entropy = tl.log(total_z) - total_s / total_z
    entropy = tl.where((bad > 0) | (m_all == float("-inf")), float("nan"), entropy)
    _, argmax = _first(top, top_idx)
    score = tl.where(real, tl.exp(best_x - m_all) / best_e, -1.0)
    _, sample = _first(score, best_idx)
    tl.store(sample_ptr + row, sample.to(tl.int64))
    tl.store(argmax_ptr + row, argmax.to(tl.int64))
    tl.store(entropy_ptr + row, entropy)


def _layout(v: int) -> tuple[int, int]:
    """(vocabulary slices per row, logits per slice)."""
    slice_len = min(CHUNKS, triton.cdiv(v, BLOCK)) * BLOCK
    return triton.cdiv(v, slice_len), slice_len


def denoiser_draw(logits: torch.Tensor, temperature, seed, round_idx, positions: torch.Tensor,
                  divided: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sample [n] int64, argmax [n] int64, entropy [n] fp32) of x = logits / temperature (see
    the module docstring); no host sync, fixed shapes (capturable).

    Args:
        logits: [n, V] contiguous, any float dtype (read in fp32).
        temperature: 0-d (or [1]) fp32 tensor on the logits' device (read when the kernel
            runs), or a host number (made one).
        seed, round_idx: ints or 0-d int64 device tensors. Token v of row i races with the
            uniform `rng.uniform(seed, rng.SAMPLE_STREAM, round_idx, positions, V)[i, v]`.
        positions: [n] int64 absolute positions.
        divided: None, or an [n, V] contiguous tensor on the same device, any float dtype,
            that receives x (cast to its dtype).
    Raises:
        ValueError: logits not a contiguous 2-D tensor, positions not [n], a temperature of
            more than one value, `divided` of another shape or not contiguous.
    """
    if logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(f"denoiser_draw expects contiguous [n, V] logits, got "
                         f"{tuple(logits.shape)}")
    n, v = logits.shape
    if positions.shape != (n,):
        raise ValueError(f"positions must be [{n}], got {tuple(positions.shape)}")
    if torch.is_tensor(temperature) and temperature.numel() != 1:
        raise ValueError(f"temperature must be one value, got shape "
                         f"{tuple(temperature.shape)}")
    if divided is not None and (divided.shape != logits.shape or not divided.is_contiguous()
                                or divided.device != logits.device):
        raise ValueError(f"divided must be a contiguous [{n}, {v}] tensor on "
                         f"{logits.device}, got {tuple(divided.shape)} on {divided.device}")
    dev = logits.device
    sample = torch.empty(n, dtype=torch.int64, device=dev)
    argmax = torch.empty(n, dtype=torch.int64, device=dev)
    entropy = torch.empty(n, dtype=torch.float32, device=dev)
    if n == 0:
        return sample, argmax, entropy
    nsl, slice_len = _layout(v)
    sp2 = triton.next_power_of_2(nsl)
    part = torch.empty(n * sp2 * PARTS, dtype=torch.float32, device=dev)
    part_idx = torch.empty(n * sp2 * 2, dtype=torch.int32, device=dev)
    opts = pdl.launch_options(logits)
    _slice_kernel[(n, nsl)](
        logits, device_scalar(temperature, torch.float32, dev),
        device_scalar(seed, torch.int64, dev), device_scalar(round_idx, torch.int64, dev),
        positions.to(torch.int64).contiguous(), divided if divided is not None else logits,
        part, part_idx, v, SLICE=slice_len, SLICES=sp2, BLOCK=BLOCK,
        WRITE=divided is not None, num_warps=NUM_WARPS, **opts)
    _merge_kernel[(n,)](part, part_idx, sample, argmax, entropy, nsl, SLICES=sp2,
                        num_warps=1 if sp2 <= 128 else 4, **opts)
    return sample, argmax, entropy
