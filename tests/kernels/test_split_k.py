"""Split-K reduction of the weight-streaming GEMMs (`dlrt.kernels.split_k`).

The fused reduction (the last split of an output tile to arrive sums the partials in split
order) must give results bit-identical to the reduction kernel, for the BF16 ("dot"), FP8
(weight-only and W8A8) and NVFP4 GEMMs, with uneven splits, N not a multiple of the tile and
M = 1 and 3; it must leave every arrival counter at 0 (the next launch, or graph replay,
starts from 0). Reference: the same product with split_k = 1 (different fp32 summation order:
relative error < 1e-5 of the largest output, fp32). CPU: TRITON_INTERPRET=1, fp32; GPU: bf16
at an SDAR-8B shape, eager and in a captured graph. The sm_90 code (compiled on the CPU): the
partials are stored before a CTA barrier, then one acquire-release GPU-scope atomic; the last
split reads them past L1.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kernel_checks import assert_replay_matches_eager, body, compile_sm90, ptx_folder  # noqa: E402

from dlrt.kernels import split_k  # noqa: E402
from dlrt.kernels.fp8_gemm import Fp8GemmConfig, fp8_gemm  # noqa: E402
from dlrt.kernels.nvfp4_gemm import Nvfp4GemmConfig, nvfp4_gemm  # noqa: E402
from dlrt.kernels.skinny_gemm import GemmConfig, skinny_gemm  # noqa: E402
from dlrt.layers.quant.fp8 import quantize_fp8_block  # noqa: E402
from dlrt.layers.quant.nvfp4 import quantize_nvfp4  # noqa: E402

INTERPRET = __import__("os").environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERPRET else "cuda"
cpu_only = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")


def _gemms(n: int, k: int, dtype: torch.dtype, seed: int):
    """name -> (call(x, split) -> y, rows served): the three GEMMs on random weights."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w8, s8 = quantize_fp8_block(w)
    p4, s4, g4 = quantize_nvfp4(w)
    w8, s8 = w8.to(DEV), s8.to(DEV)
    p4, s4, g4 = p4.to(DEV), s4.to(DEV), g4.reshape(1).to(DEV)
    wd = w.to(DEV, dtype)
    return {
        "bf16": lambda x, s: skinny_gemm(x, wd, GemmConfig(16, 32, s)),
        "fp8": lambda x, s: fp8_gemm(x, w8, s8, Fp8GemmConfig(16, 64, s)),
        "w8a8": lambda x, s: fp8_gemm(x, w8, s8, Fp8GemmConfig(16, 128, s, w8a8=True)),
        "nvfp4": lambda x, s: nvfp4_gemm(x, p4, s4, g4, Nvfp4GemmConfig(16, 128, s)),
    }


def _counters(y: torch.Tensor) -> torch.Tensor:
    """The arrival counters the launches that wrote y used."""
    return split_k._workspaces[(y.device.type, y.device.index)]


@cpu_only
@pytest.mark.parametrize("name", ["bf16", "fp8", "w8a8", "nvfp4"])
@pytest.mark.parametrize("m", [1, 3])
def test_fused_reduction_matches_the_kernel(monkeypatch, name, m):
    # N = 40: three tiles of 16, the last partial; K = 512 in 4 (bf16: 16) K tiles, 3 splits
    # for the tensor-core kernels where the tiles divide unevenly (FP8 / NVFP4), 2 for BF16
    n, k = 40, 512
    call = _gemms(n, k, torch.float32, seed=m)[name]
    splits = 2 if name == "bf16" else 3
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(10 + m))
    one = call(x, 1)
    fused = call(x, splits)
    assert (_counters(fused) == 0).all()
    again = call(x, splits)  # the counters were reset: same result
    monkeypatch.setenv("DLRT_SPLIT_K_REDUCE", "kernel")
    separate = call(x, splits)
    assert torch.equal(fused, separate) and torch.equal(fused, again)
    err = (fused - one).abs().max() / one.abs().max()
    assert err < 1e-5, err


@cpu_only
def test_counters_fall_back_when_the_grid_is_too_wide(monkeypatch):
    dev = torch.device(DEV)
    assert split_k.counters(dev, split_k.COUNTERS) is not None
    assert split_k.counters(dev, split_k.COUNTERS + 1) is None
    monkeypatch.setenv("DLRT_SPLIT_K_REDUCE", "kernel")
    assert split_k.counters(dev, 1) is None


def test_unknown_reduction_is_named(monkeypatch):
    monkeypatch.setenv("DLRT_SPLIT_K_REDUCE", "atomic")
    with pytest.raises(ValueError, match="DLRT_SPLIT_K_REDUCE='atomic'"):
        split_k.counters(torch.device("cpu"), 1)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["bf16", "fp8", "w8a8", "nvfp4"])
def test_fused_reduction_gpu(monkeypatch, name):
    """SDAR-8B's o_proj shape, M = 4, bf16, 4 splits: fused == kernel bit for bit over many
    launches (arrival races differ each time), counters back at 0, and a captured graph's
    replays equal eager calls."""
    call = _gemms(4096, 4096, torch.bfloat16, seed=7)[name]
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    fused = [call(x, 4) for _ in range(20)]
    torch.cuda.synchronize()
    assert (_counters(fused[0]) == 0).all()
    monkeypatch.setenv("DLRT_SPLIT_K_REDUCE", "kernel")
    separate = call(x, 4)
    monkeypatch.delenv("DLRT_SPLIT_K_REDUCE")
    assert all(torch.equal(y, separate) for y in fused)
    assert_replay_matches_eager(lambda v: call(v, 4), (4, 4096))
    assert (_counters(separate) == 0).all()


# --- sm_90 code (compiled on the CPU) ----------------------------------------------------------

def _compile(out: Path) -> None:
    from dlrt.kernels.skinny_gemm import _gemm_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32",
               M="i32", N="i32")
    for fused in (True, False):
        consts = dict(K=4096, BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, SPLIT_K=4, FUSED=fused,
                      PRECISION="tf32", PDL=True)
        ptx = compile_sm90(_gemm_kernel, sig, consts, num_stages=4, num_warps=4)
        (out / f"gemm-{int(fused)}.ptx").write_text(ptx)


@pytest.fixture(scope="module")
def ptx_dir(tmp_path_factory) -> Path:
    return ptx_folder(tmp_path_factory, __file__, "splitkptx")


def test_sm90_fused_reduction_code(ptx_dir):
    lines = body((ptx_dir / "gemm-1.ptx").read_text())
    atom = [i for i, ln in enumerate(lines) if re.match(r"atom\.", ln) and ".add" in ln]
    assert len(atom) == 1 and ".acq_rel" in lines[atom[0]] and ".gpu" in lines[atom[0]]
    stores = [i for i, ln in enumerate(lines) if re.match(r"st\.global", ln)]
    partial = [i for i in stores if i < atom[0]]
    assert partial, "no partial stored before the arrival"
    assert any(re.match(r"bar\.sync|barrier\.sync", ln) for ln in lines[max(partial):atom[0]])
    reads = [ln for ln in lines[atom[0]:] if re.match(r"ld\.global", ln)]
    assert reads and all(".cg" in ln for ln in reads), reads
    assert any(re.match(r"atom\..*exch", ln) for ln in lines[atom[0]:])  # the reset
    plain = body((ptx_dir / "gemm-0.ptx").read_text())
    assert not any(re.match(r"atom\.", ln) for ln in plain)


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
