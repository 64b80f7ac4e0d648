"""The rules of renoising (uniform-state) diffusion, DiffusionGemma's, as pure tensor functions.

A canvas holds no mask token: it starts as uniformly drawn tokens, and every round each position
either takes the denoiser's sample (accepted) or a fresh uniform token (renoised). After
transformers' `generation_diffusion_gemma.py` (`LinearTemperatureScheduleLogitsProcessor`,
`EntropyBoundSampler`, `StableAndConfidentStoppingCriteria`), with the noise made reproducible
(`dlrt.decoding.rng`, counter-based):

- canvas tokens (the first draw of a canvas, key 0, and the renoise after round r, key r + 1):
  `min(floor(u * V), V - 1)` in fp32, `u = rng.uniform(seed, RENOISE_STREAM, key, positions, 1)`;
- the denoiser sample of round r: `argmax(probs / -log(u))`,
  `u = rng.uniform(seed, SAMPLE_STREAM, r, positions, V)` (the law of `torch.multinomial`).

Rounds are counted from 0 within a canvas; `positions` are the canvas's absolute positions.
No host syncs and fixed shapes: the same code runs eagerly and inside a captured CUDA graph.
Values are host numbers or 0-d device tensors.
"""

from __future__ import annotations

import torch

from dlrt.decoding import rng
from dlrt.decoding.sampling import SamplingMode, SamplingSpec, candidates

_RACE = SamplingMode(greedy=False)


def schedule_temperature(t_min, t_max, steps, round_idx) -> torch.Tensor:
    """0-d fp32 temperature of round `round_idx` (0-based) of `steps` (max_denoising_steps).

    t = t_min + (t_max - t_min) * ((steps - round_idx) / steps): the reference's linear schedule
    over its remaining-step count steps - round_idx (steps at the first round, 1 at the last),
    so round 0 runs at t_max and the last at t_min + (t_max - t_min) / steps (t_min itself is
    never reached). Computed as the reference does on the values' device: t_max - t_min in
    fp64 (a Python float), the rest in fp32, and (steps - round_idx) / steps as PyTorch
    divides a tensor by a Python int there: a division on the CPU, a product with the fp32
    reciprocal of steps on CUDA (the two differ by an ulp in about one round in six).

    Args:
        t_min, t_max: float or 0-d fp64 tensor. steps, round_idx: int or 0-d int64 tensor
        (tensors on one device; host values: the CPU's arithmetic).
    """
    dev = next((x.device for x in (t_min, t_max, steps, round_idx) if torch.is_tensor(x)), None)
    lo = torch.as_tensor(t_min, dtype=torch.float64, device=dev)
    span = (torch.as_tensor(t_max, dtype=torch.float64, device=dev) - lo).float()
    n = torch.as_tensor(steps, dtype=torch.int64, device=dev)
    remaining, total = (n - round_idx).float(), n.float()
    # NOTE: CUDA's true division by a CPU scalar (the reference's cur_step / N, cur_step an
    # int32 CUDA tensor) multiplies by fp32(1 / N); the CPU's divides.
    if lo.device.type == "cuda":
        return lo.float() + span * (remaining * (torch.ones_like(total) / total))
    return lo.float() + span * (remaining / total)


def entropy_of_logits(logits: torch.Tensor) -> torch.Tensor:
    """[n] fp32 Shannon entropy (nats) of softmax(logits [n, V] fp32), computed as
    `torch.distributions.Categorical(logits=...).entropy()` does (normalised logits, clamped
    at the dtype's lowest value, times their softmax), without its host-side argument check."""
    norm = logits - logits.logsumexp(dim=-1, keepdim=True)  # [n, V]
    p_log_p = norm.clamp(min=torch.finfo(norm.dtype).min) * torch.softmax(norm, dim=-1)
    return -p_log_p.sum(-1)


def accept_by_entropy(entropy: torch.Tensor, entropy_bound) -> torch.Tensor:
    """[n] bool: the positions whose denoiser sample is accepted (the reference's
    `EntropyBoundSampler.accept_canvas`, EB-sampler).

    With the entropies sorted ascending (ties: lower index first), position of rank k is
    accepted when the sum of the entropies up to it minus its own (the largest so far) is
    <= entropy_bound (in fp32): the lowest-entropy positions whose joint dependence stays
    within the bound; the lowest always is (bound > 0). Every other position is renoised.

    Args:
        entropy: [n] fp32. entropy_bound: float or 0-d fp64 tensor (compared in fp32).
    """
    bound = torch.as_tensor(entropy_bound, dtype=torch.float64, device=entropy.device).float()
    ordered, order = torch.sort(entropy, stable=True)
    ok = torch.cumsum(ordered, dim=0) - ordered <= bound  # [n] in sorted order
    return torch.zeros_like(ok).scatter(0, order, ok)


def denoiser_sample(probs: torch.Tensor, seed, round_idx, positions: torch.Tensor
                    ) -> torch.Tensor:
    """[n] int64 token drawn from each row of probs [n, V] fp32:
    `argmax(probs / -log(u))`, `u = rng.uniform(seed, SAMPLE_STREAM, round_idx, positions, V)`
    (the exponential race, a draw of the law of `torch.multinomial`; ties to the lower id).
    seed, round_idx: int or 0-d int64 tensor."""
    spec = SamplingSpec(temperature=1.0, top_k=0, top_p=1.0, seed=seed)
    return candidates(probs, spec, round_idx, positions, mode=_RACE)[0]


def denoiser_draw(logits: torch.Tensor, temperature, seed, round_idx, positions: torch.Tensor,
                  divided: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A round's draw from its logits: (sample [n] int64, argmax [n] int64, entropy [n] fp32)
    of x = logits.float() / temperature (the reference's processed logits): the denoiser's
    sample of softmax(x) (`denoiser_sample`), argmax(x) (ties to the lower id) and the
    entropy of softmax(x) in nats (`entropy_of_logits`). `divided` [n, V] (any float dtype),
    if given, receives x (the next round's self-conditioning signal). The ops table's
    reference `denoiser_draw`; `dlrt.kernels.denoiser` computes the same in one pass.

    Args:
        logits: [n, V], any float dtype. temperature: 0-d fp32 tensor on the logits' device
            (or a number). seed, round_idx: ints or 0-d int64 tensors. positions: [n] int64.
    """
    t = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    x = logits.float() / t  # [n, V] fp32
    sample = denoiser_sample(torch.softmax(x, dim=-1), seed, round_idx, positions)
    if divided is not None:
        divided.copy_(x)
    return sample, torch.argmax(x, dim=-1), entropy_of_logits(x)


def draw_tokens(seed, key, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n] int64 uniform tokens in [0, vocab) for the canvas positions [n] int64:
    `min(floor(u * vocab), vocab - 1)` (fp32), `u = rng.uniform(seed, RENOISE_STREAM, key,
    positions, 1)`. key: 0 for a canvas's first draw, r + 1 for the renoise after round r
    (int or 0-d int64 tensor). Uniform for a power-of-two vocabulary up to 2^24; otherwise
    each token's chance is within vocab / 2^24 of 1 / vocab."""
    u = rng.uniform(seed, rng.RENOISE_STREAM, key, positions, 1)[:, 0]  # [n] fp32 in (0, 1)
    return torch.clamp(torch.floor(u * vocab).to(torch.int64), max=vocab - 1)


def stable_rounds(argmax: torch.Tensor, previous: torch.Tensor, count: torch.Tensor,
                  round_idx) -> torch.Tensor:
    """0-d int64: for how many rounds before this one the argmax canvas has been this one.

    count + 1 when `argmax` [n] equals the previous round's `previous` [n] at every position,
    else 0; 0 at round 0 (no previous round). The reference's stability test (the last
    `stability_threshold` argmax canvases all equal this one) is `count >= stability_threshold`.
    """
    same = (argmax == previous).all() & (torch.as_tensor(round_idx) > 0)
    return torch.where(same, count + 1, torch.zeros_like(count))


def should_stop(stable: torch.Tensor, entropy: torch.Tensor, stability_threshold,
                confidence_threshold) -> torch.Tensor:
    """0-d bool, the reference's `StableAndConfidentStoppingCriteria`: the argmax canvas has
    been stable for `stability_threshold` rounds (`stable` from `stable_rounds`; 0 rounds:
    always) and the mean entropy [n] fp32 is below `confidence_threshold` (strictly, in fp32).
    Thresholds: numbers or 0-d tensors (int64, fp64)."""
    bar = torch.as_tensor(confidence_threshold, dtype=torch.float64,
                          device=entropy.device).float()
    confident = entropy.mean(dim=-1) < bar
    return (stable >= torch.as_tensor(stability_threshold, device=stable.device)) & confident
