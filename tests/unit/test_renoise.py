"""The pieces of renoising (DiffusionGemma) decoding against transformers' own classes
(`generation_diffusion_gemma.py`): the temperature schedule, the entropy, the entropy-bound
acceptance and the stable-and-confident stop give identical results in fp32 on the CPU; the
canvas draws follow the documented counter-based noise."""

from __future__ import annotations

import pytest
import torch

from dlrt.decoding import rng
from dlrt.decoding.renoise import (
    accept_by_entropy,
    denoiser_sample,
    draw_tokens,
    entropy_of_logits,
    schedule_temperature,
    should_stop,
    stable_rounds,
)


@pytest.fixture
def ref():
    """transformers' DiffusionGemma generation module: the tests that compare with it skip
    without it, the others run."""
    return pytest.importorskip("transformers.models.diffusion_gemma.generation_diffusion_gemma")


def spread_logits(n: int, v: int, gen: torch.Generator) -> torch.Tensor:
    """[n, V] fp32 logits from near-uniform to one-hot rows (entropies from ~log V to ~0)."""
    scale = torch.logspace(-2, 2, n)[:, None]
    return torch.randn(n, v, generator=gen) * scale


@pytest.mark.parametrize("t_min, t_max, steps", [
    (0.4, 0.8, 48), (0.0, 1.0, 7), (0.1, 0.3, 1), (1e-3, 2.5, 1000), (0.37, 0.3700001, 33),
    (0.0, 1e-5, 10), (3.0, 1e5, 999), (0.123456789, 0.987654321, 17),
])
def test_temperature_schedule_is_the_reference_processor(ref, t_min, t_max, steps):
    """logits / t equals `LinearTemperatureScheduleLogitsProcessor` bit for bit at every round
    (the reference counts steps remaining: steps at round 0 down to 1)."""
    gen = torch.Generator().manual_seed(steps)
    logits = torch.randn(3, 11, generator=gen) * 10
    proc = ref.LinearTemperatureScheduleLogitsProcessor(t_min, t_max, steps)
    for r in range(steps):
        cur_step = torch.tensor(steps - r, dtype=torch.int32)  # as `_denoising_step` passes it
        t = schedule_temperature(t_min, t_max, steps, r)
        assert t.dtype == torch.float32 and t.shape == ()
        assert torch.equal(logits / t, proc(None, logits, cur_step=cur_step)), r
        device_values = schedule_temperature(torch.tensor(t_min, dtype=torch.float64),
                                             torch.tensor(t_max, dtype=torch.float64),
                                             torch.tensor(steps), torch.tensor(r))
        assert torch.equal(device_values, t)


@pytest.mark.gpu
def test_temperature_on_the_device_is_the_reference_processors_on_the_device(ref):
    """On CUDA, with the request values as 0-d device tensors (as a captured round reads them),
    logits / t equals the reference processor given `_denoising_step`'s int32 CUDA cur_step,
    bit for bit at every round (a CPU 0-d divisor would be a multiplication by its
    reciprocal on CUDA)."""
    dev = torch.device("cuda")
    logits = torch.randn(4, 257, device=dev, generator=torch.Generator(dev).manual_seed(0)) * 10
    for t_min, t_max, steps in ((0.4, 0.8, 1024), (0.0, 1.0, 999), (0.1, 0.7, 48),
                                (0.25, 1.3, 777), (0.123456789, 0.987654321, 17)):
        proc = ref.LinearTemperatureScheduleLogitsProcessor(t_min, t_max, steps)
        values = [torch.tensor(v, dtype=torch.float64, device=dev) for v in (t_min, t_max)]
        n = torch.tensor(steps, device=dev)
        for r in range(steps):
            cur_step = torch.tensor(steps - r, dtype=torch.int32, device=dev)
            t = schedule_temperature(*values, n, torch.tensor(r, device=dev))
            assert t.device.type == "cuda" and t.shape == ()
            expect = proc(None, logits, cur_step=cur_step)
            assert torch.equal(logits / t, expect), (t_min, t_max, steps, r)


def test_temperature_runs_from_t_max_to_one_step_above_t_min():
    temps = [schedule_temperature(0.4, 0.8, 4, r).item() for r in range(4)]
    assert temps == pytest.approx([0.8, 0.7, 0.6, 0.5])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entropy_is_categoricals(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = spread_logits(40, 97, gen)
    logits[3, :50] = float("-inf")  # tokens of probability 0
    logits[5] = 0.0  # uniform: log V
    expect = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.equal(entropy_of_logits(logits), expect)
    assert entropy_of_logits(logits)[5].item() == pytest.approx(torch.log(torch.tensor(97.0)))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("bound", [1e-6, 0.01, 0.1, 1.0, 10.0, 1e4])
def test_acceptance_is_the_entropy_bound_samplers(ref, seed, bound):
    gen = torch.Generator().manual_seed(seed)
    n, v = 64, 50
    logits = spread_logits(n, v, gen)[torch.randperm(n, generator=gen)]
    current = torch.randint(0, v, (1, n), generator=gen)
    sample = torch.randint(0, v, (1, n), generator=gen)
    sampler = ref.EntropyBoundSampler(ref.EntropyBoundSamplerConfig(entropy_bound=bound), n, v,
                                      48)
    accepted = sampler.accept_canvas(current, sample, logits[None], cur_step=5)
    mine = accept_by_entropy(entropy_of_logits(logits), bound)
    assert torch.equal(mine, sampler.accepted_token_mask[0])
    assert torch.equal(torch.where(mine, sample[0], current[0]), accepted[0])
    assert mine.any()  # the lowest entropy always


def test_acceptance_counts_grow_with_the_bound_and_ties_go_to_the_lower_position():
    ent = torch.tensor([0.5, 0.1, 0.3, 0.1, 2.0])
    assert accept_by_entropy(ent, 1e-9).tolist() == [False, True, False, False, False]
    assert accept_by_entropy(ent, 0.1).tolist() == [False, True, False, True, False]
    assert accept_by_entropy(ent, 0.5).tolist() == [True, True, True, True, False]
    assert accept_by_entropy(ent, 1.0).tolist() == [True] * 5


@pytest.mark.parametrize("threshold", [0, 1, 2, 4])
@pytest.mark.parametrize("confidence", [1e-3, 0.5, 3.0])
def test_stop_is_stable_and_confident_criteria(ref, threshold, confidence):
    """Over a sequence of argmax canvases that change, repeat and change back, with entropies
    that fall, the stop decision of every round equals the reference's (stateful) one."""
    gen = torch.Generator().manual_seed(threshold)
    n, v = 6, 9
    pattern = [0, 1, 1, 1, 2, 2, 2, 2, 2, 1, 1, 3, 3, 3, 3, 3, 3]
    canvases = torch.randint(0, v, (4, n), generator=gen)
    criteria = ref.StableAndConfidentStoppingCriteria(threshold, confidence)
    previous, count, decisions = torch.full((n,), -1), torch.zeros((), dtype=torch.int64), []
    for r, which in enumerate(pattern):
        argmax = canvases[which]
        logits = torch.randn(n, v, generator=gen) * (1 + r)  # entropy falls with r
        ent = entropy_of_logits(logits)
        count = stable_rounds(argmax, previous, count, r)
        stop = should_stop(count, ent, threshold, confidence)
        expect = criteria(argmax[None], logits[None])
        assert stop.item() == expect.item(), r
        decisions.append(stop.item())
        previous = argmax
    if confidence == 3.0:  # every round confident: only the stability counts
        assert decisions.count(True) >= 1


def test_round_zero_is_never_stable_even_if_the_canvas_matches():
    argmax = torch.tensor([4, 2])
    count = stable_rounds(argmax, argmax.clone(), torch.zeros((), dtype=torch.int64), 0)
    assert count.item() == 0
    assert stable_rounds(argmax, argmax.clone(), count, 1).item() == 1
    assert should_stop(count, torch.zeros(2), 0, 1.0).item()  # threshold 0: always stable
    assert not should_stop(count, torch.zeros(2), 1, 1.0).item()


def test_confidence_threshold_compares_in_fp32_as_the_reference():
    """The mean entropy is fp32 and the bar is rounded to fp32, as a Python float is when
    compared with an fp32 tensor."""
    ent = torch.tensor([0.1, 0.1], dtype=torch.float32)  # fp32(0.1) > 0.1
    bar = float(torch.tensor(0.1, dtype=torch.float32).item()) + 1e-12  # rounds to fp32(0.1)
    assert not should_stop(torch.ones((), dtype=torch.int64), ent, 0, bar).item()
    assert not (ent.mean(dim=-1) < bar).item()


def test_canvas_draws_follow_the_documented_noise():
    positions = torch.arange(300, 556)
    for vocab in (262144, 1000, 3, 2**25 - 1):
        for key in (0, 1, 47):
            u = rng.uniform(12345, 2, key, positions, 1)[:, 0]
            expect = torch.clamp(torch.floor(u * vocab).long(), max=vocab - 1)
            got = draw_tokens(12345, key, positions, vocab)
            assert got.dtype == torch.int64 and torch.equal(got, expect)
            assert 0 <= got.min() and got.max() < vocab
    a, b = (draw_tokens(7, k, positions, 262144) for k in (0, 1))
    assert (a != b).float().mean() > 0.99  # a renoise is a fresh draw
    assert torch.equal(a, draw_tokens(7, torch.tensor(0), positions, 262144))
    assert not torch.equal(a, draw_tokens(8, 0, positions, 262144))
    counts = torch.bincount(draw_tokens(3, 0, torch.arange(40000), 4), minlength=4)
    assert (counts - 10000).abs().max() < 400


def test_denoiser_sample_is_the_exponential_race_of_the_sample_stream():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(16, 33, generator=gen), dim=-1)
    positions = torch.arange(100, 116)
    u = rng.uniform(99, rng.SAMPLE_STREAM, 5, positions, 33)
    expect = torch.argmax(probs / -torch.log(u), dim=-1)
    assert torch.equal(denoiser_sample(probs, 99, 5, positions), expect)
    assert torch.equal(denoiser_sample(probs, torch.tensor(99), torch.tensor(5), positions),
                       expect)
    onehot = torch.zeros(4, 33)
    onehot[torch.arange(4), torch.tensor([3, 0, 32, 7])] = 1.0
    assert denoiser_sample(onehot, 1, 0, positions[:4]).tolist() == [3, 0, 32, 7]
