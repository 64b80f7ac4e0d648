"""The round's Triton candidates (greedy and sampled) never draw the mask token and agree with
the PyTorch reference where the mask token holds the top logit; a row with a NaN or +inf logit
gets a non-finite confidence on both paths (the round's fault flag). Runs under
TRITON_INTERPRET=1 on the CPU and natively on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dlrt.decoding.round import reference_candidates  # noqa: E402
from dlrt.decoding.sampling import SamplingMode, SamplingSpec  # noqa: E402
from dlrt.ops.triton import candidates  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"

MODES = [  # temperature, top_k, top_p
    (0.0, 0, 1.0),
    (0.8, 5, 0.9),
    (0.7, 0, 0.6),
    (1.2, 1, 1.0),
]


def both(logits, temperature, top_k, top_p, mask):
    spec = SamplingSpec(temperature, top_k, top_p, 11)
    mode = SamplingMode.of(spec)
    positions = torch.arange(7, 7 + logits.shape[0], device=logits.device)
    got = candidates(logits.contiguous(), spec, mode, 2, positions, mask)
    ref = reference_candidates(logits, spec, mode, 2, positions, mask)
    return got, ref


@pytest.mark.parametrize("temperature,top_k,top_p", MODES)
@pytest.mark.parametrize("v,mask", [(600, 599), (300, 0)])
def test_the_mask_token_with_the_top_logit_is_never_a_candidate(v, mask, temperature, top_k,
                                                                   top_p):
    gen = torch.Generator().manual_seed(v + mask)
    logits = (torch.randn(6, v, generator=gen) * 3).to(DEV)
    logits[:, mask] = logits.max() + 20.0  # the mask token is everyone's argmax
    (ids, conf), (ref_ids, ref_conf) = both(logits, temperature, top_k, top_p, mask)
    assert not (ids == mask).any() and not (ref_ids == mask).any()
    assert torch.equal(ids, ref_ids), (ids.tolist(), ref_ids.tolist())
    assert ((conf - ref_conf).abs() / ref_conf).max() < 1e-5
    # without the exclusion the mask token wins every greedy (and top-1) row
    if temperature == 0 or top_k == 1:
        plain, _ = both(logits, temperature, top_k, top_p, -1)
        assert (plain[0] == mask).all()


@pytest.mark.parametrize("temperature,top_k,top_p", MODES[:2])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_give_non_finite_confidences(bad, temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 300, generator=gen).to(DEV)
    logits[1, 17] = bad
    logits[3] = bad
    (_, conf), (_, ref_conf) = both(logits, temperature, top_k, top_p, 299)
    for c in (conf, ref_conf):
        assert torch.isfinite(c[[0, 2]]).all() and not torch.isfinite(c[[1, 3]]).any()
