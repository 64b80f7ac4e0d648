"""The paged attention's default launches at DiffusionGemma-26B-A4B's layers fit an sm_90 SM:
the split kernel, built for sm_90 on the CPU by Triton's bundled compiler (in a subprocess
without TRITON_INTERPRET), with the block sizes, warps and stages `_launch` picks, uses at most
227 KiB of shared memory (an H100's or H200's per block) and spills no registers (no local
memory). Layers: sliding (16 query / 8 KV heads of 256, window 1024), full (16 / 2 of 512);
the decoder's canvas of 256 (its K/V beside the cache), the encoder's causal chunk, a few
queries."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_checks import ptx_folder

SMEM_LIMIT = 227 * 1024
P16, P32, I32 = "*bf16", "*fp32", "*i32"
SIG = dict(q_ptr=P16, k_ptr=P16, v_ptr=P16, page_table_ptr=I32, lens_ptr=I32, part_o_ptr=P32,
           part_ml_ptr=P32, k_scale_ptr=P32, v_scale_ptr=P32, ck_ptr=P16, cv_ptr=P16,
           scale="fp32", N="i32")
# name: (rows n, KV heads, D, chunk_block (0: full), window (0: none), chunk K/V)
LAUNCHES = {
    "sliding-decoder": (256, 8, 256, 0, 1024, True),
    "sliding-encoder": (256, 8, 256, 1, 1024, False),
    "sliding-few": (4, 8, 256, 1, 1024, False),
    "full-decoder": (256, 2, 512, 0, 0, True),
    "full-encoder": (256, 2, 512, 1, 0, False),
    "full-few": (1, 2, 512, 1, 0, False),
}


def _build(out: Path) -> None:
    """Write resources.json: name -> {shared, regs, local} of each launch's sm_90 build."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dlrt.kernels import paged_attention as pa

    fn = pa._attn_split_kernel
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    found = {}
    for name, (n, h_kv, d, block, window, fresh) in LAUNCHES.items():
        rows = n * (16 // h_kv)
        consts = dict(H_Q=16, H_KV=h_kv, D=d, PAGE=16, CHUNK_BLOCK=block, WINDOW=window,
                      CHUNK_KV=fresh, SPLITS=8, MAX_TILES=8, BLOCK_M=pa._block_rows(rows, d),
                      BLOCK_N=pa.block_keys(1 << 20, 8, d), PRECISION="tf32", KV_SCALED=False,
                      DYNAMIC_TRIPS=True, PDL=True)
        signature = {a: SIG.get(a, "constexpr") for a in fn.arg_names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                   if SIG.get(a, "").startswith("*")}
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts,
                                          attrs=aligned),
                                target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=pa.split_warps(False, d),
                                             num_stages=pa.split_stages(d)))
        cubin = out / f"{name}.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
        found[name] = dict(shared=kernel.metadata.shared,
                           regs=int(re.search(r"REG:(\d+)", usage).group(1)),
                           local=int(re.search(r"LOCAL:(\d+)", usage).group(1)),
                           stack=int(re.search(r"STACK:(\d+)", usage).group(1)))
    (out / "resources.json").write_text(json.dumps(found))


@pytest.fixture(scope="module")
def resources(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    folder = ptx_folder(tmp_path_factory, __file__, "attention-resources")
    return json.loads((folder / "resources.json").read_text())


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_the_default_launch_fits_an_sm90(resources, name):
    r = resources[name]
    assert r["shared"] <= SMEM_LIMIT, r
    assert r["local"] == 0 and r["stack"] == 0, r  # no register spills
    assert r["regs"] <= 255, r


if __name__ == "__main__":
    assert "TRITON_INTERPRET" not in os.environ
    _build(Path(sys.argv[1]))
