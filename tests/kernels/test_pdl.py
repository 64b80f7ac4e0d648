"""Programmatic dependent launch: every kernel compiled for sm_90 with PDL on follows the
protocol of `dlrt.kernels.pdl` (no global load before `griddepcontrol.wait`; dependents
released; the GEMM's weight prefetch issued before the wait). Compiled on the CPU with Triton's
bundled ptxas, in a subprocess without TRITON_INTERPRET (the test session interprets kernels);
the GPU tests run the same kernels with PDL on against their references."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from kernel_checks import body, compile_sm90, global_loads, ptx_folder

from dlrt.kernels import pdl

P16, P32, I32, I64 = "*bf16", "*fp32", "*i32", "*i64"
GEMV_ARGS = dict(x_ptr=P16, w_ptr=P16, s_ptr=P32, y_ptr=P16, N="i32")
GEMV_CONSTS = dict(K=4096, ROWS=4, BLOCK_N=8, BLOCK_K=256, AHEAD=2, VEC=8, X_ROW=False,
                   SCALED=False)


def _kernels() -> dict:
    """name -> (kernel, {arg: type}, {constexpr: value}); PDL is added."""
    from dlrt.kernels import (
        activation,
        greedy,
        moe,
        moe_align,
        moe_route,
        paged_attention,
        rms_norm,
        rope,
        sampling,
        skinny_gemm,
        split_k,
    )
    slices = dict(SLICE=2560, SLICES=64, BLOCK=512)
    moe_args = dict(in_ptr=P16, w_ptr=P16, s_ptr=P32, out_ptr=P16, table_ptr=I32, wt_ptr=P32,
                    T="i32", N_OUT="i32")
    search = dict(logits_ptr=P16, stats_ptr=P32, acc_ptr=I64, zk_ptr=I64, V="i32", nsl="i32",
                  exclude="i32")
    rope_args = dict(qkv_ptr=P16, qw_ptr=P16, kw_ptr=P16, cos_ptr=P32, sin_ptr=P32,
                     pos_ptr=I64, page_table_ptr=I32, k_cache_ptr=P16, v_cache_ptr=P16,
                     q_out_ptr=P16, k_scale_ptr=P32, v_scale_ptr=P32, eps="fp32")
    rope_consts = dict(H_Q=32, H_KV=8, D=128, ROT=128, PASS=1, PAGE=64, HAS_NORM=True,
                       FP32_ROPE=False)
    norm_args = dict(x_ptr=P16, res_ptr=P16, w_ptr=P16, y_ptr=P16, s_ptr=P32, H="i32",
                     eps="fp32")
    silu_args = dict(gu_ptr=P16, out_ptr=P16, s_ptr=P32, inter="i32")
    split_args = dict(q_ptr=P16, k_ptr=P16, v_ptr=P16, page_table_ptr=I32, lens_ptr=I32,
                      part_o_ptr=P32, part_ml_ptr=P32, k_scale_ptr=P32, v_scale_ptr=P32,
                      ck_ptr=P16, cv_ptr=P16, scale="fp32", N="i32")
    split_consts = dict(H_Q=32, H_KV=8, D=128, PAGE=64, CHUNK_BLOCK=4, WINDOW=0, CHUNK_KV=False,
                        SPLITS=64, MAX_TILES=8, BLOCK_M=16, BLOCK_N=64, PRECISION="tf32",
                        DYNAMIC_TRIPS=True)
    return {
        "sample_max": (sampling._max_kernel, search, slices),
        "sample_pass": (sampling._pass_kernel,
                        dict(search, ties_ptr=P32, t_ptr="*fp64", k_ptr=I64, p_ptr=P32,
                             j="i32"), dict(slices, MASS=True, USE_K=True)),
        "sample_race": (sampling._race_kernel,
                        dict(search, seed_ptr=I64, round_ptr=I64, pos_ptr=I64, ties_ptr=P32,
                             race_ptr=P32, race_idx_ptr=I32, t_ptr="*fp64", k_ptr=I64,
                             p_ptr=P32), dict(slices, USE_K=True, USE_P=True)),
        "sample_pick": (sampling._pick_kernel, dict(race_ptr=P32, race_idx_ptr=I32, ids_ptr=I64,
                                                    conf_ptr=P32, nsl="i32"), dict(SLICES=64)),
        "rms_norm": (rms_norm._rms_norm_kernel, norm_args, dict(HAS_RES=True, QUANT=False,
                                                                BLOCK=4096)),
        "rms_norm_fp8": (rms_norm._rms_norm_kernel, dict(norm_args, y_ptr="*u8"),
                         dict(HAS_RES=True, QUANT=True, BLOCK=4096)),
        "silu_mul": (activation._silu_mul_kernel, silu_args, dict(QUANT=False, BLOCK=1024)),
        "silu_mul_fp8": (activation._silu_mul_kernel, dict(silu_args, out_ptr="*u8"),
                         dict(QUANT=True, BLOCK=1024)),
        "qk_norm_rope": (rope._qk_norm_rope_kernel, rope_args,
                         dict(rope_consts, KV_FP8=False)),
        "qk_norm_rope_fp8": (rope._qk_norm_rope_kernel,  # the cache as bytes
                             dict(rope_args, k_cache_ptr="*u8", v_cache_ptr="*u8"),
                             dict(rope_consts, KV_FP8=True)),
        "attention_split": (paged_attention._attn_split_kernel, split_args,
                            dict(split_consts, KV_SCALED=False)),
        "attention_split_fp8": (paged_attention._attn_split_kernel,
                                dict(split_args, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv"),
                                dict(split_consts, KV_SCALED=True)),
        "attention_split_window": (  # DiffusionGemma's decoder on a sliding layer
            paged_attention._attn_split_kernel, split_args,
            dict(split_consts, H_Q=16, D=256, CHUNK_BLOCK=0, WINDOW=1024, CHUNK_KV=True,
                 BLOCK_M=64, KV_SCALED=False)),
        "attention_merge": (paged_attention._attn_merge_kernel,
                            dict(part_o_ptr=P32, part_ml_ptr=P32, lens_ptr=I32, out_ptr=P16,
                                 NH="i32"),
                            dict(D=128, SPLITS=64, SPLITS_P2=64, BLOCK_N=64, WINDOW=0)),
        "greedy_slice": (greedy._slice_kernel, dict(logits_ptr=P16, part_ptr=P32, part_idx_ptr=I32,
                                                    V="i32", exclude="i32"),
                         dict(SLICE=5120, BLOCK=1024, SLICES=32)),
        "greedy_merge": (greedy._merge_kernel, dict(part_ptr=P32, part_idx_ptr=I32, ids_ptr=I64,
                                                    conf_ptr=P32), dict(SLICES=32)),
        "gemm": (skinny_gemm._gemm_kernel, dict(x_ptr=P16, w_ptr=P16, y_ptr=P16, part_ptr=P32,
                                                count_ptr=I32, M="i32", N="i32"),
                 dict(K=4096, BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, SPLIT_K=4, FUSED=True,
                      PRECISION="tf32")),
        "gemv": (skinny_gemm._gemv_kernel, GEMV_ARGS, GEMV_CONSTS),
        "gemv_row": (skinny_gemm._gemv_kernel, GEMV_ARGS,  # 4 warps along K: x as one row
                     dict(GEMV_CONSTS, BLOCK_N=4, BLOCK_K=1024, X_ROW=True)),
        "moe_route": (moe_route._route_kernel,
                      dict(logits_ptr=P32, bias_ptr=P32, scale_ptr=P32, w_ptr=P32, id_ptr=I64,
                           scaling="fp32"),
                      dict(E=256, G=8, GS=32, G_P2=8, GS_P2=32, TOPK=8, K_P2=8, TOPK_GROUP=4,
                           SIGMOID=True, HAS_BIAS=True, RENORM=True, HAS_SCALE=False)),
        "moe_align": (moe_align._align_kernel, dict(ids_ptr=I64, table_ptr=I32, NK="i32",
                                                     T="i32"),
                      dict(E=128, E_P2=128, R=16, BLOCK=32)),
        "moe_rows": (moe._rows_kernel, moe_args,
                     dict(K=2048, TOPK=8, GATED=True, ACTIVATION="silu", ROWS=4, BLOCK_N=32,
                          BLOCK_K=128, VEC=8, FP8=False, ROW_BLOCK=128,
                          SCALE_COLS=1)),
        "moe_rows_fp8": (moe._rows_kernel, dict(moe_args, w_ptr="*fp8e4nv"),
                         dict(K=2048, TOPK=8, GATED=True, ACTIVATION="silu", ROWS=4,
                              BLOCK_N=32, BLOCK_K=128, VEC=8, FP8=True, ROW_BLOCK=128,
                              SCALE_COLS=16)),
        "moe_tiles": (moe._tiles_kernel, moe_args,
                      dict(K=2048, TOPK=8, GATED=True, ACTIVATION="silu", BLOCK_M=16,
                           BLOCK_N=64, BLOCK_K=256, PRECISION="tf32", FP8=False, UNROLL=1,
                           ROW_BLOCK=128, SCALE_COLS=1)),
        "moe_tiles_fp8": (moe._tiles_kernel, dict(moe_args, w_ptr="*fp8e4nv"),
                          dict(K=2048, TOPK=8, GATED=True, ACTIVATION="silu", BLOCK_M=16,
                               BLOCK_N=64, BLOCK_K=128, PRECISION="tf32", FP8=True, UNROLL=2,
                               ROW_BLOCK=128, SCALE_COLS=16)),
        "moe_combine": (moe._combine_kernel, dict(y_ptr=P32, out_ptr=P16, H="i32"),
                        dict(TOPK=8, BLOCK=1024)),
        "gemm_reduce": (split_k._reduce_kernel, dict(part_ptr=P32, y_ptr=P16, M="i32",
                                                         N="i32"),
                        dict(SPLIT_K=4, BLOCK_M=16, BLOCK=1024)),
    }

NAMES = ["attention_merge", "attention_split", "attention_split_fp8", "attention_split_window",
         "gemm", "gemm_reduce", "gemv", "gemv_row", "greedy_merge", "greedy_slice", "moe_align",
         "moe_combine", "moe_route", "moe_rows", "moe_rows_fp8", "moe_tiles", "moe_tiles_fp8",
         "qk_norm_rope", "qk_norm_rope_fp8", "rms_norm", "rms_norm_fp8", "sample_max",
         "sample_pass", "sample_pick", "sample_race", "silu_mul", "silu_mul_fp8"]
PDL_OFF = ["rms_norm", "gemm"]
GEMVS = ["gemv", "gemv_row"]
WEIGHT_FIRST = GEMVS  # load their first weight tiles before the wait


def _compile_all(out: Path) -> None:
    """Write <name>-<pdl>.ptx for every kernel (run without TRITON_INTERPRET)."""
    kernels = _kernels()
    assert sorted(kernels) == NAMES
    for name, (fn, sig, consts) in kernels.items():
        for use_pdl in (True, False) if name in PDL_OFF else (True,):
            ptx = compile_sm90(fn, sig, {**consts, "PDL": use_pdl})
            (out / f"{name}-{int(use_pdl)}.ptx").write_text(ptx)


@pytest.fixture(scope="module")
def ptx_dir(tmp_path_factory) -> Path:
    return ptx_folder(tmp_path_factory, __file__, "ptx")


def _ptx(ptx_dir: Path, name: str, use_pdl: bool) -> str:
    return (ptx_dir / f"{name}-{int(use_pdl)}.ptx").read_text()


@pytest.mark.parametrize("name", sorted(set(NAMES) - set(WEIGHT_FIRST)))
def test_no_global_load_before_wait(ptx_dir, name):
    lines = body(_ptx(ptx_dir, name, True))
    waits = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")]
    assert waits, "PDL kernel never waits for its predecessor"
    loads = global_loads(lines)
    assert loads and min(loads) > min(waits), f"{name} reads global memory before its wait"
    writes = [i for i, ln in enumerate(lines) if re.match(r"(st|atom|red)\.global", ln)]
    assert not writes or min(writes) > min(waits), f"{name} writes before its wait"
    assert any(ln.startswith("griddepcontrol.launch_dependents") for ln in lines)


@pytest.mark.parametrize("name", ["gemm"] + GEMVS)
def test_gemms_release_after_their_main_loop(ptx_dir, name):
    lines = body(_ptx(ptx_dir, name, True))
    wait = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait"))
    release = next(i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.launch"))
    math = [i for i, ln in enumerate(lines) if re.match(r"(mma|wgmma|fma)\.", ln)]
    assert math and wait < release and max(math) < release < len(lines)
    if name in GEMVS:  # AHEAD=2 weight tiles in flight before the wait, x only after it:
        # a bf16 tile over 128 threads (4 warps) in 16-byte loads
        c = _kernels()[name][2]
        per_tile = c["BLOCK_N"] * c["BLOCK_K"] * 2 // 16 // 128
        early = [lines[i] for i in global_loads(lines) if i < wait]
        assert len(early) == 2 * per_tile, early
        assert all(ln.startswith("ld.global.v4") for ln in early), early


@pytest.mark.parametrize("name", GEMVS)
def test_gemv_loops_have_no_barrier(ptx_dir, name):
    """x is read in the weight tile's layout: no shared-memory layout conversion (and so no
    bar.sync) inside any loop of the GEMV."""
    lines = _ptx(ptx_dir, name, True).splitlines()
    heads = [(i, ln.split(":")[0].strip()) for i, ln in enumerate(lines)
             if "Loop Header" in ln]
    assert heads
    for start, label in heads:
        back = re.compile(rf"bra(\.uni)?\s+{re.escape(label)};")
        end = max(i for i, ln in enumerate(lines) if back.search(ln))
        assert not [ln for ln in lines[start:end] if "bar.sync" in ln or "barrier" in ln], label


@pytest.mark.parametrize("name", PDL_OFF)
def test_pdl_off_emits_no_griddepcontrol(ptx_dir, name):
    assert "griddepcontrol" not in _ptx(ptx_dir, name, False)


def test_enabled_only_for_cuda_tensors():
    x = torch.zeros(2)
    assert not pdl.enabled(x)
    assert pdl.launch_options(x) == {"PDL": False}


if __name__ == "__main__":
    _compile_all(Path(sys.argv[1]))
