"""The masked-diffusion log-likelihood estimator (`dlrt.eval.likelihood`) on small random models
of a full-attention family (LLaDA) and a block-causal one (SDAR, blocks of 4): its draws are
uniform as stated, its mean over many draws matches the expectation enumerated over every mask
(within 4 standard errors, the variance enumerated too), a block's forward against the cached
prefix equals one forward of the clean prefix and the noisy block, it is deterministic for a
seed, and is_greedy agrees with dlrt's own greedy decoding, one token a round."""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import combinations

import pytest
import torch

from dlrt import LLM
from dlrt.errors import OptionError, PromptError
from dlrt.eval.likelihood import LikelihoodEstimator, Unit, draw, units

MASK, EOS, VOCAB = 500, 501, 512


def _small(tmp_path_factory, preset_name: str, **fields):
    """A checkpoint of a tiny preset with a 512-token vocabulary (mask 500, eos 501) and larger
    random weights (so its predictions depend on the context), fp32."""
    from dlrt.checkpoint.make import make_checkpoint
    from dlrt.checkpoint.presets import preset

    cfg, gen = preset(preset_name)
    cfg.update(vocab_size=VOCAB, mask_token_id=MASK, eos_token_id=EOS, **fields)
    gen.update(eos_token_id=EOS, pad_token_id=EOS)
    src = tmp_path_factory.mktemp(preset_name) / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "generation_config.json").write_text(json.dumps(gen))
    return make_checkpoint(str(src), src.parent / "ckpt", dtype="float32")


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    path = _small(tmp_path_factory, "tiny-llada", embedding_size=VOCAB, pad_token_id=EOS,
                  init_std=0.3, max_sequence_length=64)
    return LLM(path, device="cpu")


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    path = _small(tmp_path_factory, "tiny-sdar", bos_token_id=EOS, initializer_range=0.3,
                  max_position_embeddings=64)
    return LLM(path, device="cpu")


def _exact(scorer, unit: Unit) -> tuple[float, float]:
    """The mean and variance of one draw's (L / l) * logprob, every mask enumerated:
    l uniform in 1..L, then each of the C(L, l) subsets equally likely."""
    n = len(unit.positions)
    mean = square = 0.0
    for count in range(1, n + 1):
        subsets = list(combinations(unit.positions, count))
        for masked in subsets:
            x = n / count * scorer.logprob(unit, masked)
            weight = 1 / n / len(subsets)
            mean += weight * x
            square += weight * x * x
    return mean, square - mean * mean


def test_units_cover_the_continuation():
    assert units(6, 11, None) == [Unit(0, 11, (6, 7, 8, 9, 10), None)]
    assert units(6, 11, 4) == [Unit(4, 8, (6, 7), 4), Unit(8, 11, (8, 9, 10), 4)]
    assert units(8, 12, 4) == [Unit(8, 12, (8, 9, 10, 11), 4)]
    assert units(5, 5, 4) == [] and units(5, 5, None) == []


def test_draws_are_uniform_in_count_then_subset():
    """l uniform in 1..3, then each subset of that size equally likely: each of the 3 singles
    and 3 pairs 1/9, the triple 1/3 (7200 draws, within 5 binomial standard deviations)."""
    gen = torch.Generator().manual_seed(0)
    n = 7200
    seen = Counter(tuple(draw((4, 5, 6), gen)) for _ in range(n))
    want = {s: 1 / 9 for k in (1, 2) for s in combinations((4, 5, 6), k)}
    want[(4, 5, 6)] = 1 / 3
    assert set(seen) == set(want)
    for subset, p in want.items():
        assert abs(seen[subset] - n * p) < 5 * math.sqrt(n * p * (1 - p)), (subset, seen)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_mean_of_many_draws_is_the_enumerated_expectation(family, request):
    """Full attention (one term over 3 tokens) and block-causal (context 6, continuation 5:
    blocks [4, 8) with 2 continuation tokens and [8, 11) with 3): 400 draws a term."""
    llm = request.getfixturevalue(family)
    context = [5, 17, 42, 99, 7, 64] if family == "sdar" else [5, 17, 42, 99]
    continuation = [300, 12, 81, 8, 250] if family == "sdar" else [7, 300, 12]
    n = 400
    est = LikelihoodEstimator(llm, mc_num=n, seed=3, check_greedy=False)
    scorer = est.scorer(context, continuation)
    assert len(scorer.units) == (2 if family == "sdar" else 1)
    terms = [_exact(scorer, u) for u in scorer.units]
    mean = sum(m for m, _ in terms)
    se = math.sqrt(sum(v for _, v in terms) / n)
    value, greedy = est.loglikelihood(context, continuation)
    assert greedy is False
    assert abs(value - mean) < 4 * se, (value, mean, se)
    # the reweighting matters at this precision: without L / l the mean is far off
    plain = sum(sum(scorer.logprob(u, s) / len(u.positions) / math.comb(len(u.positions), k)
                    for k in range(1, len(u.positions) + 1)
                    for s in combinations(u.positions, k)) for u in scorer.units)
    assert abs(plain - mean) > 10 * se


def test_a_block_reads_the_clean_prefix_from_the_cache(sdar):
    """A block's score equals one forward of [clean prefix + the block with its masks]
    (block-causal from position 0), whatever block was scored before (the cache is rewritten
    clean where an earlier score left masks)."""
    context, continuation = [5, 17, 42, 99, 7, 64], [300, 12, 81, 8, 250, 3, 9]
    est = LikelihoodEstimator(sdar, mc_num=1)
    scorer = est.scorer(context, continuation)
    ids = torch.tensor(context + continuation)

    def reference(unit: Unit, masked: tuple[int, ...]) -> float:
        chunk = ids[:unit.end].clone()
        chunk[list(masked)] = MASK
        rows = torch.tensor(masked)
        logits = sdar.runner.forward_at(chunk, 0, chunk_block=4, rows=rows).float()
        return float(torch.log_softmax(logits, -1).gather(1, ids[rows][:, None]).sum())

    first, middle, last = scorer.units
    assert (first.start, middle.start, last.start, last.end) == (4, 8, 12, 13)
    order = [(last, (12,)), (first, (6, 7)), (middle, (9, 11)), (last, (12,)),
             (first, (7,)), (middle, (8, 10, 11))]
    for unit, masked in order:
        got = scorer.logprob(unit, masked)
        assert got == pytest.approx(reference(unit, masked), abs=1e-4), (unit, masked)


def test_deterministic_for_a_seed_whatever_the_order(llada):
    a = ([5, 17, 42], [7, 300, 12])
    b = ([9, 9, 1, 2], [44, 45])
    est = LikelihoodEstimator(llada, mc_num=16, seed=7)
    first = [est.loglikelihood(*a), est.loglikelihood(*b)]
    again = LikelihoodEstimator(llada, mc_num=16, seed=7)
    assert [again.loglikelihood(*b), again.loglikelihood(*a)] == first[::-1]
    other = LikelihoodEstimator(llada, mc_num=16, seed=8).loglikelihood(*a)
    assert other[0] != first[0][0]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_is_greedy_agrees_with_greedy_decoding_one_token_a_round(family, request):
    """The continuation that dlrt's own decoder gives (greedy, the most confident position a
    round: low_confidence_static with as many rounds as positions) is greedy; a changed token
    is not. SDAR: the continuation ends on a block boundary (context 6, 6 new tokens)."""
    llm = request.getfixturevalue(family)
    context = [5, 17, 42, 99, 7, 64]
    block = 4 if family == "sdar" else 6
    out = llm.generate(context, max_new_tokens=6, block_length=block, denoising_steps=block,
                       remasking_strategy="low_confidence_static", temperature=0,
                       ignore_eos=True).token_ids
    assert len(out) == 6
    est = LikelihoodEstimator(llm, mc_num=2)
    assert est.loglikelihood(context, out)[1] is True
    for i in (0, 5):
        changed = list(out)
        changed[i] = (changed[i] + 1) % MASK
        assert est.loglikelihood(context, changed)[1] is False
    assert LikelihoodEstimator(llm, mc_num=2, check_greedy=False).loglikelihood(
        context, out)[1] is False


def test_an_empty_continuation_is_certain(llada):
    assert LikelihoodEstimator(llada, mc_num=4).loglikelihood([1, 2, 3], []) == (0.0, True)


def test_refusals(llada, tiny_diffusion_gemma):
    with pytest.raises(OptionError, match="mc_num"):
        LikelihoodEstimator(llada, mc_num=0)
    with pytest.raises(OptionError, match="seed"):
        LikelihoodEstimator(llada, seed=-1)
    with pytest.raises(PromptError, match="do not fit the context of 64"):
        LikelihoodEstimator(llada).loglikelihood(list(range(60)), list(range(5)))
    gemma = LLM(tiny_diffusion_gemma, device="cpu")
    with pytest.raises(OptionError, match="no mask token"):
        LikelihoodEstimator(gemma)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_on_cuda_the_same_masks_give_the_cpu_s_numbers(family, request):
    """The draws come from a CPU generator: on CUDA (fp32, Triton kernels and attention, the
    engine's graph mode loaded beside) the estimate and is_greedy are the CPU's, to fp32
    rounding."""
    cpu = request.getfixturevalue(family)
    gpu = LLM(cpu.folder.path, device="cuda", dtype="float32", attention_backend="triton")
    context, continuation = [5, 17, 42, 99, 7, 64], [300, 12, 81, 8, 250]
    want = LikelihoodEstimator(cpu, mc_num=32, seed=1).loglikelihood(context, continuation)
    got = LikelihoodEstimator(gpu, mc_num=32, seed=1).loglikelihood(context, continuation)
    assert got[0] == pytest.approx(want[0], rel=1e-4, abs=1e-3) and got[1] == want[1]
