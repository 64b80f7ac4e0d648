"""The persistent layer kernel (`dlrt.kernels.layer_stream.layer_mlp`) against a float64
reference of the unfused layer.

Fresh random inputs; awkward shapes: a hidden size that is not a power of two, weights whose
rows do not fill the last tile, more programs than tiles (tiles shrink to 16 rows; programs
with nothing to do still meet every barrier), one program, 1-4 rows. Under TRITON_INTERPRET=1
the stages run as separate launches; on the GPU the single launch with grid barriers must give
the bits of the staged launches, also replayed from a CUDA graph (the barrier's counter is
reused across launches). Tolerance against float64: fp32 1e-5, bf16 2^-6 of the largest output
(the reference rounds each product once).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.kernels.layer_stream import StreamConfig, layer_mlp  # noqa: E402
from dlrt.layers.mlp import silu_and_mul_reference  # noqa: E402
from dlrt.layers.norm import RMSNorm  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])

# (rows, A, H, I, config, grid)
CASES = [
    (4, 64, 96, 128, StreamConfig(32, 32, stages=2, warps=1), 3),  # H not a power of two
    (3, 32, 64, 96, StreamConfig(16, 32, stages=3, warps=1), 5),
    (1, 64, 64, 64, StreamConfig(16, 64, stages=4, warps=2), 2),
    (2, 128, 48, 64, StreamConfig(32, 16, stages=1, warps=1), 2),  # 48 rows: a partial tile
    (4, 64, 32, 64, StreamConfig(64, 32, stages=2, warps=1), 9),  # more programs than tiles
    (2, 32, 48, 32, StreamConfig(16, 16, stages=2, warps=1), 1),  # one program does it all
]


def make(case, dtype, seed=0):
    m, a, h, i, _, _ = case
    gen = torch.Generator().manual_seed(seed + 31 * m + a + h + i)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEV, dtype)

    norm = RMSNorm(h, 1e-6).to(DEV, dtype)
    norm.weight.data = (torch.rand(h, generator=gen) + 0.5).to(DEV, dtype)
    return dict(attn=rand(m, a, scale=2.0), stream=rand(m, h), w_o=rand(h, a, scale=a**-0.5),
                norm=norm, w_gate_up=rand(2 * i, h, scale=h**-0.5),
                w_down=rand(h, i, scale=i**-0.5))


def run(t, cfg, **kw):
    return layer_mlp(t["attn"], t["stream"], t["w_o"], t["norm"].weight, t["norm"].eps,
                     t["w_gate_up"], t["w_down"], cfg, **kw)


def reference(t):
    """The unfused layer in float64 products, rounded to the dtype where the layer rounds."""
    dt = t["attn"].dtype
    s1 = (t["attn"].double() @ t["w_o"].double().T).to(dt) + t["stream"]
    gu = (t["norm"].reference(s1).double() @ t["w_gate_up"].double().T).to(dt)
    return (silu_and_mul_reference(gu).double() @ t["w_down"].double().T).to(dt) + s1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-A{c[1]}-H{c[2]}-I{c[3]}-g{c[5]}"
                                             for c in CASES])
def test_layer_mlp_matches_the_reference(case, dtype):
    t = make(case, dtype)
    cfg, grid = case[4], case[5]
    out = run(t, cfg, grid=grid)
    ref = reference(t)
    tol = 1e-5 if dtype == torch.float32 else 2**-6
    err = ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
    assert out.shape == t["stream"].shape and err < tol, err
    if DEV == "cuda":  # the single launch against its stages (the CPU always runs staged)
        assert torch.equal(out, run(t, cfg, grid=grid, staged=True))


def test_layer_mlp_rejects_bad_arguments():
    t = make(CASES[0], torch.float32)
    cfg = CASES[0][4]
    with pytest.raises(ValueError, match="does not fit"):
        run(t, StreamConfig(32, 64))  # 64 does not divide H = 96
    with pytest.raises(ValueError, match="does not fit"):
        run(t, StreamConfig(24, 32))  # block_n not a power of two
    with pytest.raises(ValueError, match="does not fit"):
        run(t, StreamConfig(8, 32))  # block_n below the dot's 16
    bad = dict(t, w_down=t["w_down"][:, :-1].contiguous())
    with pytest.raises(ValueError, match="w_gate_up"):
        run(bad, cfg)
    with pytest.raises(ValueError, match="M<=4"):
        run(dict(t, attn=torch.zeros(5, 64, device=DEV), stream=torch.zeros(5, 96, device=DEV)),
            cfg)
    with pytest.raises(ValueError, match="w_o"):
        run(dict(t, w_o=t["w_o"].T.contiguous().T), cfg)  # not contiguous
    with pytest.raises(ValueError, match="norm is torch.float64"):
        run(dict(t, norm=t["norm"].double()), cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("per_sm", [1, 2])
def test_layer_mlp_one_launch_equals_staged_on_real_shapes(per_sm):
    """SDAR-1.7B's shapes in bf16 (A = H = 2048, I = 6144), 4 rows: the single launch with
    grid barriers equals the staged launches bit for bit, eagerly and replayed 3 times from one
    CUDA graph with fresh inputs between replays."""
    case = (4, 2048, 2048, 6144, StreamConfig(32, 256, stages=4, warps=4, per_sm=per_sm), None)
    t = make(case, torch.bfloat16)
    cfg = case[4]
    staged = run(t, cfg, staged=True)
    assert torch.equal(run(t, cfg), staged)
    err = ((staged.double() - reference(t).double()).abs().max()
           / reference(t).double().abs().max()).item()
    assert err < 2**-6, err
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run(t, cfg)
    for seed in (1, 2, 3):
        fresh = make(case, torch.bfloat16, seed=seed)
        for key in ("attn", "stream"):
            t[key].copy_(fresh[key])
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run(t, cfg, staged=True)), seed


@pytest.mark.gpu
def test_layer_mlp_refuses_a_grid_that_cannot_be_resident():
    case = (4, 512, 512, 1024, StreamConfig(32, 256, stages=4, warps=4), None)
    t = make(case, torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with pytest.raises(RuntimeError, match="cannot all be resident"):
        run(t, case[4], grid=64 * sms)


def test_small_stages_take_smaller_tiles():
    cfg = StreamConfig(64, 32)
    assert cfg.stage_block_n(4096, 132) == 16  # 256 tiles of 16 rows: >= 132 programs
    assert cfg.stage_block_n(24576, 132) == 64
    assert cfg.stage_block_n(8192, 132) == 32  # 128 tiles of 64 < 132
    assert cfg.stage_block_n(40, 7) == 16  # never below 16
