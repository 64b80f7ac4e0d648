"""The fused sampling kernel (temperature, top-k, top-p, exponential race) against the PyTorch
reference `dlrt.decoding.sampling` on the same noise.

Fresh random logits, vocabularies that are not multiples of the kernel's block, many ties at
the top-k cut, a tie group straddling the top-p cut, -inf logits, k >= V, one row and many
rows. Token ids must be identical (the draw uses the same uniforms; a flip needs two race
scores within a few fp32 ulps), confidences within 1e-5 relative. Runs under TRITON_INTERPRET=1
on the CPU and natively on the GPU, where bf16 logits and the real vocabulary size are added.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from dlrt.decoding.sampling import SamplingSpec, candidates, probabilities  # noqa: E402
from dlrt.kernels import sampling as ks  # noqa: E402
from dlrt.kernels.sampling import sample_candidates  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def draw(logits, temperature, top_k, top_p, positions, seed=7, round_idx=3):
    """(kernel ids, kernel conf, reference ids, reference conf, reference probabilities)."""
    ids, conf = sample_candidates(logits.contiguous(), temperature, top_k, top_p, seed,
                                  round_idx, positions)
    spec = SamplingSpec(temperature, top_k, top_p, seed)
    probs = probabilities(logits, spec)
    ref_ids, ref_conf = candidates(probs, spec, round_idx, positions)
    return ids, conf, ref_ids, ref_conf, probs


def check(logits, temperature, top_k, top_p, seed=7, round_idx=3):
    n = logits.shape[0]
    positions = torch.arange(40, 40 + n, device=logits.device)
    ids, conf, ref_ids, ref_conf, probs = draw(logits, temperature, top_k, top_p, positions,
                                               seed, round_idx)
    assert ids.dtype == torch.int64 and conf.dtype == torch.float32 and ids.shape == (n,)
    assert torch.equal(ids, ref_ids), (ids.tolist(), ref_ids.tolist())
    err = ((conf - ref_conf).abs() / ref_conf).max()
    assert err < 1e-5, float(err)
    return ids, probs


CASES = [  # n, V, temperature, top_k, top_p
    (4, 1000, 0.8, 50, 0.9),
    (5, 777, 1.0, 0, 0.7),  # top-p alone
    (3, 513, 0.5, 7, 1.0),  # top-k alone
    (1, 300, 1.3, 0, 1.0),  # no filter
    (2, 400, 0.9, 1000, 0.95),  # k >= V
    (9, 257, 0.7, 1, 1.0),  # k = 1: the argmax
]


@pytest.fixture(params=["default", "small"])
def layout(request, monkeypatch):
    """The default program layout, and small blocks: several slices per row and several
    blocks per slice even at these vocabulary sizes."""
    if request.param == "small":
        monkeypatch.setattr(ks, "BLOCK", 128)
        monkeypatch.setattr(ks, "CHUNKS", 2)
    return request.param


@pytest.mark.parametrize("n,v,temperature,top_k,top_p", CASES)
def test_matches_reference(n, v, temperature, top_k, top_p, layout):
    gen = torch.Generator().manual_seed(n * v + top_k)
    logits = (torch.randn(n, v, generator=gen) * 3).to(DEV)
    ids, probs = check(logits, temperature, top_k, top_p)
    if top_k == 1:
        assert torch.equal(ids, logits.argmax(-1))


def test_ties_at_the_top_k_cut_are_all_kept(layout):
    """Integer logits: the k-th value is shared by many tokens, every one of them kept."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randint(-4, 3, (8, 300), generator=gen).float().to(DEV)
    logits[:, 5] = 3.0  # one token above the rest
    ids, probs = check(logits, 2.0, 10, 1.0)
    kept = (probs > 0).sum(-1)
    assert bool((kept > 10).all())  # the ties at the 10th value widen the set
    # with a high temperature the tied tokens win races, so the test sees the cut
    assert bool((ids != 5).any())


def test_ties_at_the_top_p_cut_follow_token_order(layout):
    """One token of mass 0.3 and ten tied tokens of 0.05 each, their ids spread over the
    kernel's vocabulary slices: with p = 0.57 the tied tokens whose preceding mass is
    0.30 ... 0.55 are kept (the first six by id), the other four are not, over 16 draws."""
    v = 1100
    mass = torch.full((v,), 0.2 / (v - 11))
    mass[517] = 0.3
    tied = [3, 290, 312, 520, 533, 838, 841, 850, 1057, 1099]
    mass[tied] = 0.05
    logits = torch.log(mass).repeat(16, 1).to(DEV)
    ids, probs = check(logits, 1.0, 0, 0.57)
    assert (probs[0] > 0).nonzero().flatten().tolist() == sorted([517] + tied[:6])
    assert set(ids.tolist()) <= {517, *tied[:6]}
    assert tied[5] in ids.tolist()  # the last kept tie is drawn: a cut one token off differs


def test_bf16_grid_values_and_minus_inf():
    """Logits on the bf16 grid (many exact ties) with -inf entries, top-k then top-p."""
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, 1200, generator=gen) * 4).bfloat16().float()
    logits[:, ::7] = -math.inf
    check(logits.to(DEV), 0.6, 200, 0.8)
    check(logits.to(DEV), 1.0, 0, 0.95, seed=2**40 + 3, round_idx=0)


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(positions=torch.zeros(3, dtype=torch.int64)),
                                 dict(logits=torch.zeros(2, 8, 4))])
def test_bad_arguments(bad):
    args = dict(logits=torch.zeros(2, 8), temperature=1.0, top_k=0, top_p=1.0, seed=0,
                round_idx=0, positions=torch.zeros(2, dtype=torch.int64))
    args.update(bad)
    with pytest.raises(ValueError, match="logits|positions|temperature"):
        sample_candidates(**args)


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="needs CUDA")
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 50, 0.9), (1.0, 0, 0.95),
                                                     (0.7, 0, 1.0)])
def test_real_vocabulary_bf16(temperature, top_k, top_p):
    """SDAR's vocabulary, bf16 logits from a random LM head: the draw of the round."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    h = torch.randn(4, 2048, device="cuda", generator=gen).bfloat16()
    head = (torch.randn(151936, 2048, device="cuda", generator=gen) * 0.05).bfloat16()
    check(h @ head.T, temperature, top_k, top_p)
