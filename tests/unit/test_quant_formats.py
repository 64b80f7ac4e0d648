"""FP8 block and NVFP4 quantisation, dequantisation and linear methods against plain per-block
references written element by element here (awkward shapes: K not a multiple of 128, N odd,
M = 1 and 3), NVFP4's nibble order and rounding, and the quantised experts of the MoE layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.moe import StackedExperts
from dlrt.layers.quant import expand_rows, fp8, nvfp4
from dlrt.layers.quant.convert import quantize_module

SHAPES = [(1, 1), (3, 200), (129, 257), (256, 128), (5, 300)]


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 0.1
    return w.to(torch.bfloat16)


def _fp8_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block by block: scale = amax / 448 (1 for a zero block), q = e4m3(clamp(w / scale))."""
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(nb, kb)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
            amax = blk.abs().max()
            s[i, j] = amax / 448.0 if amax > 0 else 1.0
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = \
                (blk / s[i, j]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("n,k", SHAPES)
def test_fp8_block_quantisation_matches_reference(n, k):
    w = _weight(n, k)
    if n > 128:
        w[:128, :128] = 0  # an all-zero block: scale 1, codes 0
    q, s = fp8.quantize_fp8_block(w)
    rq, rs = _fp8_reference(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (n, k)
    assert s.dtype == torch.float32 and s.shape == (-(-n // 128), -(-k // 128))
    assert torch.equal(_bits(q), _bits(rq)) and torch.equal(s, rs)
    deq = fp8.dequantize_fp8_block(q, s, torch.float32)
    ref = torch.stack([q[i].float() * s[i // 128].repeat_interleave(128)[:k] for i in range(n)])
    assert torch.equal(deq, ref)
    # e4m3: 3 mantissa bits (half ulp 2^-4 relative), subnormal spacing 2^-9 of the scale
    scale = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    err = (deq - w.float()).abs()
    assert torch.all(err <= w.float().abs() * 2**-4 + scale * 2**-10 * (1 + 1e-6))
    # the scale rows repeated per weight row give the same weight
    assert torch.equal(fp8.dequantize_fp8_block(q, s.repeat_interleave(128, 0)[:n], torch.float32),
                       deq)


def _held(fmt, stored: torch.Tensor, suffix: str, rows: int) -> torch.Tensor:
    """A stored tensor in the held layout of `rows` weight rows."""
    return expand_rows(stored, fmt.expand[suffix], rows).expand(
        (-(-rows // fmt.row_block.get(suffix, 1)), *stored.shape[1:]) if fmt.expand[suffix]
        else (rows,))


def _linear(fmt_name: str, n: int, k: int, w: torch.Tensor, merged: bool = False):
    """A linear layer holding w quantised as make-checkpoint would (one part, or two)."""
    fmt = fp8.FP8_FORMAT if fmt_name == "fp8" else nvfp4.NVFP4_FORMAT
    with torch.device("meta"):
        layer = (MergedLinear(k, {"a": n - n // 2, "b": n // 2}) if merged else Linear(k, n))
    quantize_module(layer, fmt)
    parts = [(0, n - n // 2), (n - n // 2, n)] if merged else [(0, n)]
    held = {name: [] for name in layer.quant_params}
    for lo, hi in parts:
        stored = layer.quant_format.quantize(w[lo:hi])
        for name, (_, suffix) in layer.quant_params.items():
            held[name].append(_held(layer.quant_format, stored[suffix], suffix, hi - lo))
    for name in held:
        layer._parameters[name] = torch.nn.Parameter(torch.cat(held[name]), requires_grad=False)
    return layer


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("merged", [False, True])
def test_linear_methods_equal_f_linear_on_dequantised_weight(fmt, m, merged):
    n, k = 129, (208 if fmt == "nvfp4" else 200)
    w = _weight(n, k, seed=1)
    layer = _linear(fmt, n, k, w, merged)
    assert layer.method.name == fmt and layer.method.quantized
    if fmt == "fp8" and merged:  # parts of 65 and 64 rows: one scale row per weight row
        assert layer.quant_format is fp8.FP8_ROWS_FORMAT and layer.weight_scale_inv.shape == (n, 2)
    x = torch.randn(m, k, dtype=torch.float32)
    if fmt == "fp8":
        deq = fp8.dequantize_fp8_block(layer.weight, layer.weight_scale_inv, torch.float32)
    else:
        deq = nvfp4.dequantize_nvfp4(layer.weight, layer.weight_scale, layer.weight_scale_2,
                               torch.float32)
    if fmt == "fp8":  # weight-only: the exact product with the dequantised weight
        layer.method.activations = "weight_only"
    assert torch.equal(layer(x), F.linear(x, deq))
    if fmt == "fp8":  # dynamic (the default): x quantised per token and 128-column group
        layer.method.activations = "dynamic"
        assert torch.equal(layer(x), F.linear(fp8.quantize_activations(x), deq))
        assert not torch.equal(layer(x), F.linear(x, deq))
    # the memory is the format's: no dequantised copy is kept on the layer
    assert layer.weight.dtype == (torch.float8_e4m3fn if fmt == "fp8" else torch.uint8)
    held = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert held < n * k * (1.1 if fmt == "fp8" else 0.6)


def test_nvfp4_packing_order_and_rounding():
    """Element 2j in the low nibble, 2j+1 in the high nibble; sign is bit 3; ties to even."""
    codes = torch.tensor([[1, 2, 3, 4, 15, 0]], dtype=torch.uint8)
    packed = nvfp4.pack(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F]]
    assert torch.equal(nvfp4.unpack(packed), codes)
    v = torch.tensor([0.0, 0.2, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, -0.5, -6.0])
    assert nvfp4.e2m1_codes(v).tolist() == [0, 0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 9, 15]


def _nvfp4_reference(w: torch.Tensor):
    """Group by group: global = amax / 2688; group scale = e4m3(group amax / (6 * global));
    codes by nearest e2m1 value (ties to the even code)."""
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    n, k = w.shape
    w = w.float()
    g = w.abs().max() / 2688.0
    scales = torch.empty(n, k // 16, dtype=torch.float8_e4m3fn)
    codes = torch.empty(n, k, dtype=torch.uint8)
    for i in range(n):
        for j in range(k // 16):
            grp = w[i, j * 16:(j + 1) * 16]
            s = grp.abs().max() / (6.0 * g)
            s = torch.tensor(1.0) if s == 0 else s
            scales[i, j] = s.clamp(max=448).to(torch.float8_e4m3fn)
            for t in range(16):
                x = grp[t] / (scales[i, j].float() * g)
                d = (values - x.abs()).abs()
                best = [c for c in range(8) if d[c] == d.min()]
                c = min(best, key=lambda c: (c % 2, c))  # a tie goes to the even code
                codes[i, j * 16 + t] = c + (8 if x < 0 else 0)
    return nvfp4.pack(codes), scales, g


@pytest.mark.parametrize("n,k", [(1, 16), (3, 48), (7, 160)])
def test_nvfp4_quantisation_matches_reference(n, k):
    w = _weight(n, k, seed=2)
    q, s, g = nvfp4.quantize_nvfp4(w)
    rq, rs, rg = _nvfp4_reference(w)
    assert q.dtype == torch.uint8 and q.shape == (n, k // 2)
    assert s.dtype == torch.float8_e4m3fn and s.shape == (n, k // 16)
    assert g.dtype == torch.float32 and g.shape == ()
    assert torch.equal(q, rq) and torch.equal(_bits(s), _bits(rs)) and torch.equal(g, rg)
    deq = nvfp4.dequantize_nvfp4(q, s, g.expand(n), torch.float32)
    unit = (s.float() * g).repeat_interleave(16, 1)  # one e2m1 step at 2 is 1 unit at most
    assert torch.all((deq - w.float()).abs() <= unit * 1.0 + 1e-12)


def test_nvfp4_needs_k_divisible_by_16():
    with torch.device("meta"):
        layer = Linear(40, 8)
    with pytest.raises(ValueError, match="divisible by 16"):
        quantize_module(layer, nvfp4.NVFP4_FORMAT)


@pytest.mark.parametrize("fmt", [fp8.FP8_FORMAT, nvfp4.NVFP4_FORMAT])
def test_quantised_experts_read_dequantised(fmt):
    """expert_weight of quantised experts = the format's dequantisation of each expert, for an
    int, an index tensor, and all experts; the layout follows the parts (I=32: rows)."""
    e, h, i = 4, 64, 32
    with torch.device("meta"):
        ex = StackedExperts(e, h, i)
    quantize_module(ex, fmt)
    ref13, ref2 = [], []
    for name in ex.quant_params:
        ex._parameters[name] = torch.nn.Parameter(
            torch.empty(getattr(ex, name).shape, dtype=ex.param_dtypes[name]),
            requires_grad=False)
    for x in range(e):
        for weight, n, k, ref in (("w13", 2 * i, h, ref13), ("w2", h, i, ref2)):
            w = _weight(n, k, seed=10 + x)
            stored = ex.quant_format.quantize(w)
            for name, (wt, suffix) in ex.quant_params.items():
                if wt == weight:
                    getattr(ex, name).data[x].copy_(_held(ex.quant_format, stored[suffix],
                                                          suffix, n))
            held = {s: getattr(ex, nm)[x] for nm, (wt, s) in ex.quant_params.items()
                    if wt == weight}
            ref.append(ex.quant_format.dequantize(held, k, torch.float32))
    ids = torch.tensor([[3, 0], [1, 1]])
    assert torch.equal(ex.expert_weight("w13", 2, torch.float32), ref13[2])
    assert torch.equal(ex.expert_weight("w2", ids, torch.float32),
                       torch.stack(ref2)[ids])
    assert torch.equal(ex.expert_weight("w13", None, torch.float32), torch.stack(ref13))


def test_dynamic_activation_quantisation():
    """Per row and 128-column group: s = amax / 448 (1 for an all-zero group), values
    e4m3(x / s) * s; a partial last group over its own columns; relative error within e4m3's
    half step (2^-4) of each group's largest value."""
    x = torch.randn(3, 300) * torch.tensor([1.0, 50.0, 1e-3])[:, None]
    x[1, 128:256] = 0.0
    q = fp8.quantize_activations(x)
    assert q.shape == x.shape and q.dtype == x.dtype
    assert torch.equal(q[1, 128:256], x[1, 128:256])
    for g in range(3):
        xg, qg = x[:, g * 128:(g + 1) * 128], q[:, g * 128:(g + 1) * 128]
        amax = xg.abs().amax(dim=1, keepdim=True)
        s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        want = (xg / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
        assert torch.equal(qg, want)
        assert ((qg - xg).abs() <= amax * 2.0 ** -4 + 1e-30).all()
    assert not torch.equal(q, x)
    with pytest.raises(ValueError, match="activations"):
        fp8.Fp8Linear(activations="static")
