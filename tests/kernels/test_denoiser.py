"""The denoiser's draw kernel (`dlrt.kernels.denoiser`) against plain PyTorch formulas of a
renoising round: x = logits.float() / t (t a 0-d fp32 tensor), the race sample
argmax(softmax(x) / -log(u)) with u = rng.uniform(seed, SAMPLE_STREAM, round, positions, V),
argmax(x), and the entropy `torch.distributions.Categorical(logits=x).entropy()`.

Fresh random logits of several scales and temperatures (flat to nearly one-hot rows),
vocabularies off the kernel's block, several slices per row, -inf tokens, logits that tie only
after the division, bf16 logits, device-tensor values. Tolerances: sample, argmax and the
written x identical (a sample flip needs two race scores within a few fp32 ulps); entropy
within 1e-6 (1 + H) nats of the fp64 entropy and within 2e-5 nats of the fp32 reference (whose
own error reaches ~1e-5 at these shapes). Runs under TRITON_INTERPRET=1 on the CPU; on the GPU
also the real shape (a 256-position canvas over DiffusionGemma's 262144 tokens) and a captured
graph's replay against eager calls. The sm_90 PTX (compiled on the CPU) divides with the IEEE
division the reference's x needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kernel_checks import body, compile_sm90, ptx_folder  # noqa: E402

from dlrt.decoding import rng  # noqa: E402
from dlrt.kernels import denoiser as kd  # noqa: E402
from dlrt.kernels.denoiser import denoiser_draw  # noqa: E402
from dlrt.ops import reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def expected(logits, t, seed, round_idx, positions):
    """(sample, argmax, entropy, x) by the round's PyTorch formulas."""
    x = logits.float() / t
    u = rng.uniform(seed, rng.SAMPLE_STREAM, round_idx, positions, x.shape[-1])
    sample = torch.argmax(torch.softmax(x, dim=-1) / -torch.log(u), dim=-1)
    entropy = torch.distributions.Categorical(logits=x, validate_args=False).entropy()
    return sample, torch.argmax(x, dim=-1), entropy, x


def check(logits, t: float, seed=7, round_idx=3, write=True):
    n, v = logits.shape
    positions = torch.arange(100, 100 + n, device=logits.device)
    temp = torch.tensor(t, dtype=torch.float32, device=logits.device)
    divided = torch.full((n, v), float("nan"), device=logits.device) if write else None
    sample, argmax, entropy = denoiser_draw(logits, temp, seed, round_idx, positions, divided)
    want_sample, want_argmax, want_entropy, x = expected(logits, temp, seed, round_idx,
                                                         positions)
    assert sample.dtype == argmax.dtype == torch.int64 and entropy.dtype == torch.float32
    assert torch.equal(sample, want_sample), (sample.tolist(), want_sample.tolist())
    assert torch.equal(argmax, want_argmax)
    exact = torch.distributions.Categorical(logits=x.double(), validate_args=False).entropy()
    err = (entropy.double() - exact).abs()
    assert (err <= 1e-6 * (1 + exact)).all(), float(err.max())
    assert float((entropy - want_entropy).abs().max()) < 2e-5
    if write:
        assert torch.equal(divided, x)
    return sample, argmax, entropy


@pytest.fixture(params=["default", "small"])
def layout(request, monkeypatch):
    """The default program layout, and small blocks: several slices per row and several
    blocks per slice."""
    if request.param == "small":
        monkeypatch.setattr(kd, "BLOCK", 128)
        monkeypatch.setattr(kd, "CHUNKS", 3)
    return request.param


CASES = [  # n, V, logit scale, temperature
    (4, 3000, 3.0, 0.4),
    (3, 777, 1.0, 1.0),  # flat rows: entropy near log V
    (5, 2000, 30.0, 0.1),  # nearly one-hot rows
    (2, 100, 10.0, 0.7),
    (1, 1500, 5.0, 0.25),
]


@pytest.mark.parametrize("n,v,scale,t", CASES)
def test_matches_the_round_formulas(n, v, scale, t, layout):
    gen = torch.Generator().manual_seed(n * v)
    # soft-capped like DiffusionGemma's logits (cap 30)
    logits = (30 * torch.tanh(torch.randn(n, v, generator=gen) * scale / 30)).to(DEV)
    check(logits, t)


def test_masked_tokens_ties_and_bf16(layout):
    """-inf tokens (a whole slice of them), logits that tie only after the division (the
    first id wins: the division is the reference's, not a product with 1 / t), bf16 logits."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 1200, generator=gen) * 4
    logits[0, 300:900] = float("-inf")
    logits[1, ::2] = float("-inf")
    # the largest logit b at id 11, a smaller a at id 4 with a / t == b / t in fp32
    t = torch.tensor(3.0)
    a = torch.tensor(25.0)
    b = torch.nextafter(a, torch.tensor(30.0))
    while (b / t) != (a / t):
        a = b
        b = torch.nextafter(a, torch.tensor(30.0))
    logits[2, 4], logits[2, 11] = a, b
    _, argmax, _ = check(logits.to(DEV), 3.0)
    assert argmax[2] == 4 and logits[2].argmax() == 11
    check(logits.to(DEV).bfloat16(), 0.5, write=False)


def test_device_values_and_the_ops_table():
    """Seed, round and temperature as 0-d tensors (a captured graph's request values) give the
    host values' draw; the ops tables' `denoiser_draw` agree, and the reference's is the
    round's formulas."""
    from dlrt.ops import triton as triton_ops

    gen = torch.Generator().manual_seed(9)
    logits = (torch.randn(6, 900, generator=gen) * 4).to(DEV)
    pos = torch.arange(40, 46, device=DEV)
    on_device = dict(dtype=torch.int64, device=DEV)
    t = torch.tensor(0.3, device=DEV)
    host = denoiser_draw(logits, t, 11, 2, pos)
    dev = denoiser_draw(logits, t, torch.tensor(11, **on_device), torch.tensor(2, **on_device),
                        pos)
    for a, b in zip(host, dev, strict=True):
        assert torch.equal(a, b)
    divided = torch.empty(6, 900, device=DEV)
    ref = reference.denoiser_draw(logits, t, 11, 2, pos, divided)
    want = expected(logits, t, 11, 2, pos)
    assert torch.equal(ref[0], want[0]) and torch.equal(ref[1], want[1])
    assert torch.equal(ref[2], want[2]) and torch.equal(divided, want[3])
    got = triton_ops.OPS.denoiser_draw(logits, t, 11, 2, pos)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert float((got[2] - ref[2]).abs().max()) < 2e-5
    # another seed, round or position draws another sample somewhere
    assert not torch.equal(denoiser_draw(logits, t, 12, 2, pos)[0], host[0])
    assert not torch.equal(denoiser_draw(logits, t, 11, 3, pos)[0], host[0])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NaN arithmetic
def test_non_finite_rows_get_a_nan_entropy():
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(2)).to(DEV)
    logits[1, 7] = float("nan")
    logits[2, 400] = float("inf")
    logits[3, :] = float("-inf")
    _, _, entropy = denoiser_draw(logits, torch.tensor(0.5), 0, 0,
                                  torch.arange(4, device=DEV))
    assert torch.isfinite(entropy[0]) and entropy[1:].isnan().all()


def test_bad_arguments():
    x = torch.zeros(2, 64, device=DEV)
    pos = torch.arange(2, device=DEV)
    t = torch.tensor(1.0)
    with pytest.raises(ValueError, match="contiguous"):
        denoiser_draw(x.t(), t, 0, 0, pos)
    with pytest.raises(ValueError, match=r"positions must be \[2\]"):
        denoiser_draw(x, t, 0, 0, pos[:1])
    with pytest.raises(ValueError, match="one value"):
        denoiser_draw(x, torch.ones(2), 0, 0, pos)
    with pytest.raises(ValueError, match=r"divided must be a contiguous \[2, 64\]"):
        denoiser_draw(x, t, 0, 0, pos, torch.empty(2, 63, device=DEV))
    empty = denoiser_draw(x[:0], t, 0, 0, pos[:0])
    assert [e.shape for e in empty] == [(0,), (0,), (0,)]


REAL_V = 262144  # DiffusionGemma's vocabulary


def real_logits(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(DEV).manual_seed(seed)
    return 30 * torch.tanh(torch.randn(n, REAL_V, device=DEV, generator=gen) * 0.2)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1.0, 0.4, 0.1])
def test_real_shape_gpu(t):
    """A 256-position canvas; the divided logits written in bf16 (the self-conditioning
    buffer's dtype) equal x rounded to bf16."""
    logits = real_logits(256, int(t * 10))
    check(logits, t)
    pos = torch.arange(256, device=DEV)
    temp = torch.tensor(t, device=DEV)
    divided = torch.empty(256, REAL_V, dtype=torch.bfloat16, device=DEV)
    denoiser_draw(logits, temp, 1, 0, pos, divided)
    assert torch.equal(divided, (logits / temp).bfloat16())


@pytest.mark.gpu
def test_graph_replay_matches_eager_gpu():
    logits = real_logits(256, 1)
    pos = torch.arange(256, device=DEV)
    seed = torch.tensor(5, device=DEV)
    round_idx = torch.tensor(0, device=DEV)
    t = torch.tensor(0.4, device=DEV)
    divided = torch.empty(256, REAL_V, dtype=torch.bfloat16, device=DEV)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        denoiser_draw(logits, t, seed, round_idx, pos, divided)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = denoiser_draw(logits, t, seed, round_idx, pos, divided)
    for r in range(3):  # new values read from device memory at each replay
        round_idx.fill_(r)
        t.fill_(0.4 - 0.1 * r)
        logits.copy_(real_logits(256, 10 + r))
        graph.replay()
        torch.cuda.synchronize()
        eager = denoiser_draw(logits, t, seed, round_idx, pos)
        for a, b in zip(outs, eager, strict=True):
            assert torch.equal(a, b)


def _compile(out: Path) -> None:
    sig = dict(logits_ptr="*fp32", t_ptr="*fp32", seed_ptr="*i64", round_ptr="*i64",
               pos_ptr="*i64", div_ptr="*bf16", part_ptr="*fp32", part_idx_ptr="*i32", V="i32")
    consts = dict(SLICE=4096, SLICES=64, BLOCK=1024, WRITE=True, PDL=True)
    (out / "slice.ptx").write_text(compile_sm90(kd._slice_kernel, sig, consts,
                                                num_warps=kd.NUM_WARPS))


def test_sm90_divides_like_the_reference(tmp_path_factory):
    """x = logits / t with div.rn.f32 (IEEE, as PyTorch divides by a device tensor), not the
    approximate division or a product with 1 / t, so the argmax and the written x are the
    reference's bit for bit."""
    ptx = body((ptx_folder(tmp_path_factory, __file__, "denoiserptx") / "slice.ptx")
               .read_text())
    assert any(ln.startswith("div.rn.f32") for ln in ptx)


if __name__ == "__main__":
    _compile(Path(sys.argv[1]))
