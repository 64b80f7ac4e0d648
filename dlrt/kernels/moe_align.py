"""Group the (token, expert) pairs of a MoE layer by expert, on the device, in one launch.

Pair p = token * k + j routes token to expert ids[token, j]. One program (fixed shapes, no
host sync: capturable) counts the pairs of each expert (histograms), cuts each expert's run
into tiles of at most `tile_rows` pairs, and lists the pairs sorted by (expert, p): chunks of
up to 1024 pairs are sorted on the key (expert, p) in registers and placed after the pairs of
earlier chunks (deterministic: no atomics). The expert kernels take one tile per program and
read the tile count from device memory; programs past it exit at once.

Layout of the int32 table `align_pairs` returns (`max_tiles` = T):
  table[0]                    number of live tiles
  table[1 + 3t : 4 + 3t]      tile t: (expert, first position in `pairs`, pairs in the tile)
  table[1 + 3T : 1 + 3T + NK] pairs: the pair indices sorted by (expert, pair index)
  table[1 + 3T + NK :]        scratch (one cursor per expert)
Tiles are in expert order, an expert's tiles in pair order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dlrt.kernels import pdl


def max_tiles(pairs: int, experts: int, tile_rows: int) -> int:
    """Bound on the tiles of `pairs` pairs over `experts` experts in tiles of `tile_rows`:
    sum_e ceil(c_e / R) <= floor(NK / R) + (experts touched), whatever the routing."""
    if tile_rows >= pairs:
        return min(experts, pairs)
    return pairs // tile_rows + min(experts, pairs)


def align_warps(pairs: int) -> int:
    """Warps of the one program, more for more pairs (the fastest measured on an H200: about
    2 us for 32 pairs, 4 us for 512, 46 us for 8192)."""
    return 4 if pairs <= 256 else 8 if pairs <= 1024 else 16


@triton.jit
def _align_kernel(ids_ptr, table_ptr, NK, E: tl.constexpr, E_P2: tl.constexpr,
                  T, R: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.begin(PDL)
    ex = tl.arange(0, E_P2)
    q = tl.arange(0, BLOCK)
    tiles_ptr = table_ptr + 1
    pairs_ptr = table_ptr + 1 + 3 * T
    cursor_ptr = pairs_ptr + NK
    counts = tl.zeros([E_P2], tl.int32)
    for c0 in range(0, NK, BLOCK):
        ok = c0 + q < NK
        e = tl.load(ids_ptr + c0 + q, mask=ok, other=0).to(tl.int32)
        counts += tl.histogram(e, E_P2)
        counts -= tl.where(ex == 0, BLOCK - tl.sum(ok.to(tl.int32), axis=0), 0)  # padding
    ntiles = (counts + R - 1) // R
    first_tile = tl.cumsum(ntiles, axis=0) - ntiles
    start = tl.cumsum(counts, axis=0) - counts
    tl.store(table_ptr, tl.sum(ntiles, axis=0))
    for i in range(0, tl.max(ntiles, axis=0)):
        live = i < ntiles
        tile = tiles_ptr + 3 * (first_tile + i)
        tl.store(tile, ex, mask=live)
        tl.store(tile + 1, start + i * R, mask=live)
        tl.store(tile + 2, tl.minimum(counts - i * R, R), mask=live)
    # positions, a chunk at a time: sort the chunk by (expert, pair); the pair at sorted index s
    # goes to cursor[e] + s - (pairs of lower experts in the chunk)
    cursor = start
    for c0 in range(0, NK, BLOCK):
        ok = c0 + q < NK
        e = tl.load(ids_ptr + c0 + q, mask=ok, other=0).to(tl.int32)
        hist = tl.histogram(e, E_P2) - tl.where(ex == 0, BLOCK - tl.sum(ok.to(tl.int32), axis=0),
                                                0)
        before = tl.cumsum(hist, axis=0) - hist
        tl.store(cursor_ptr + ex, cursor - before, mask=ex < E)
        tl.debug_barrier()
        key = tl.sort(tl.where(ok, e, E_P2) * BLOCK + q)  # padding sorts last
        se = key // BLOCK
        live = se < E
        pos = tl.load(cursor_ptr + se, mask=live, other=0) + q
        tl.store(pairs_ptr + pos, c0 + key % BLOCK, mask=live)
        cursor += hist
        tl.debug_barrier()


def align_pairs(ids: torch.Tensor, num_experts: int, tile_rows: int,
                warps: int | None = None) -> torch.Tensor:
    """Pairs grouped by expert (see the module docstring for the table's layout).

    Args:
        ids: [N, k] expert ids (int32 or int64, in [0, num_experts)), contiguous.
        tile_rows: R, the most pairs in a tile (R >= N*k: one tile per touched expert).
        warps: the program's warps (None: `align_warps`).
    Returns:
        the int32 table, 1 + 3 * max_tiles(N*k, E, R) + N*k + E entries (a new tensor).
    """
    if ids.dim() != 2 or not ids.is_contiguous() or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"align_pairs expects contiguous int [N, k] ids, got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    nk = ids.numel()
    t = max_tiles(nk, num_experts, tile_rows)
    table = torch.empty(1 + 3 * t + nk + num_experts, dtype=torch.int32, device=ids.device)
    if nk == 0:
        table[0] = 0
        return table
    block = min(1024, triton.next_power_of_2(nk))
    _align_kernel[(1,)](ids, table, nk, E=num_experts, E_P2=triton.next_power_of_2(num_experts),
                        T=t, R=tile_rows, BLOCK=block, num_warps=warps or align_warps(nk),
                        **pdl.launch_options(ids))
    return table
