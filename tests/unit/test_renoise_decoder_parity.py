"""The `renoise` decoder against transformers' own `DiffusionGemmaForBlockDiffusion.generate()`
(the test extra pins the version), in fp32 on the CPU: identical tokens, stop and rounds.

Tiny reference models with seeded random weights are written by `save_pretrained` and loaded
by dlrt's loader (`LLM`). The reference's three draws are patched to dlrt's documented noise
(README, "Renoising decoding"): its `EntropyBoundSampler.initialize_canvas` (a canvas's first
draw, key 0, and its renoise after round r, key r + 1: `renoise.draw_tokens`) and the
`torch.multinomial` of its denoiser sample (round r: the race on `rng.uniform(seed, 0, r,
positions, V)`), at the canvas's absolute positions. Cases: several seeds, prompts and
windows; several canvases (canvas_length 8) and a `max_new_tokens` that is not a multiple of
it; canvases that stop early and at the round budget; small and large entropy bounds; a stop
id inside a canvas; the prompt's encoder pass in one chunk and in several.

Both run the model in fp32 but not bit for bit alike (relative error ~1e-6, as
`test_diffusion_gemma_parity` measures). With random weights the self-conditioning loop is
chaotic: softmax(logits / t) turned into soft embeddings and RMS-normalised grows a difference
about tenfold per round, so after a few rounds round-off, not the decoding rules, would decide
the argmax. The models here scale the self-conditioning MLP's output projection by
SIGNAL_GAIN (0.1), which makes the loop contractive (the difference stays ~1e-6 over 12
rounds) while the signal still decides tokens (`test_the_scaled_signal_still_decides_tokens`).

What the reference returns, and what dlrt returns of it: the reference generates
ceil(max_new_tokens / canvas_length) whole canvases (prompt + that many canvases, not cut at
max_new_tokens) and ends after the canvas that holds an eos id, keeping the eos (the tokens
after it become pad when generation_config sets pad_token_id). dlrt returns the same tokens up
to the first stop id (excluded, `finish_reason` "stop", `stop_reason` the id) or up to
max_new_tokens ("length").
"""

from __future__ import annotations

import pytest
import torch
from test_diffusion_gemma_parity import F, S, reference_model

from dlrt import LLM
from dlrt.decoding import rng
from dlrt.decoding.renoise import draw_tokens
from dlrt.runtime import renoise_decoder

gen_module = pytest.importorskip(
    "transformers.models.diffusion_gemma.generation_diffusion_gemma",
    reason="this transformers has no diffusion_gemma (the test extra pins it)")

EOS = [1, 106]  # text_config's eos ids (generation_config.json as saved names none)
SIGNAL_GAIN = 0.1  # the self-conditioning MLP's output projection, scaled (module docstring)
# (seed, sliding window, layer types, prompt length)
MODELS = [(0, 6, [S, F, S, S], 11), (1, 40, [S, S, F, F], 5), (2, 3, [F, S, S, F], 19)]
BASE = dict(max_denoising_steps=6, entropy_bound=0.1, t_min=0.4, t_max=0.8,
            stability_threshold=1, confidence_threshold=0.005)
CASES = {  # name -> (options, max_new_tokens, canvases stop early (True), at the budget
    # (False) or either (None))
    "reference defaults": ({}, 24, False),
    "small bound, confident": (dict(entropy_bound=1e-3, stability_threshold=0,
                                    confidence_threshold=4.0), 17, True),
    "large bound, cold, confident": (dict(entropy_bound=50.0, t_min=0.01, t_max=0.05,
                                          stability_threshold=0, confidence_threshold=0.2),
                                     20, True),
    "accept all, stable for 2 rounds": (dict(entropy_bound=1e4, stability_threshold=2,
                                             confidence_threshold=1e3, max_denoising_steps=9,
                                             t_min=0.0, t_max=0.1), 32, None),
}

class ReferenceNoise:
    """The reference's draws on dlrt's documented noise: which canvas and round it is in,
    tracked through its `_prepare_denoiser_inputs` (one per canvas) and `_denoising_step`
    (one per round, `cur_step` counting down from max_denoising_steps)."""

    def __init__(self, monkeypatch, seed: int, prompt_len: int, canvas: int, vocab: int,
                 steps: int):
        self.seed, self.prompt_len, self.canvas, self.vocab = seed, prompt_len, canvas, vocab
        self.index, self.round, self.key = -1, 0, 0
        self.rounds: list[int] = []  # rounds run per canvas
        mixin = gen_module.DiffusionGemmaGenerationMixin
        prepare, step = mixin._prepare_denoiser_inputs, mixin._denoising_step

        def prepare_canvas(model, **kw):
            self.index, self.key = self.index + 1, 0
            self.rounds.append(0)
            return prepare(model, **kw)

        def denoising_step(model, **kw):
            self.round = steps - int(kw["cur_step"])
            self.key = self.round + 1  # the renoise after this round
            self.rounds[-1] += 1
            return step(model, **kw)

        monkeypatch.setattr(mixin, "_prepare_denoiser_inputs", prepare_canvas)
        monkeypatch.setattr(mixin, "_denoising_step", denoising_step)
        monkeypatch.setattr(gen_module.EntropyBoundSampler, "initialize_canvas",
                            lambda sampler, batch_size, device: self.draw()[None])
        monkeypatch.setattr(torch, "multinomial", self.multinomial)

    def positions(self) -> torch.Tensor:
        return self.prompt_len + self.index * self.canvas + torch.arange(self.canvas)

    def draw(self) -> torch.Tensor:
        return draw_tokens(self.seed, self.key, self.positions(), self.vocab)

    def multinomial(self, probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        assert num_samples == 1 and probs.shape == (self.canvas, self.vocab)
        u = rng.uniform(self.seed, rng.SAMPLE_STREAM, self.round, self.positions(), self.vocab)
        return torch.argmax(probs / -torch.log(u), dim=-1)[:, None]


def reference_generate(ref, prompt: torch.Tensor, options: dict, max_new: int, seed: int,
                       eos: list[int], monkeypatch):
    """(new tokens, rounds per canvas) of the reference's generate() on the documented noise."""
    c = ref.config
    with monkeypatch.context() as m:
        noise = ReferenceNoise(m, seed, len(prompt), c.canvas_length, c.text_config.vocab_size,
                               options["max_denoising_steps"])
        out = ref.generate(
            prompt[None], max_new_tokens=max_new, eos_token_id=eos,
            max_denoising_steps=options["max_denoising_steps"],
            sampler_config=gen_module.EntropyBoundSamplerConfig(float(options["entropy_bound"])),
            t_min=float(options["t_min"]), t_max=float(options["t_max"]),
            stability_threshold=options["stability_threshold"],
            confidence_threshold=float(options["confidence_threshold"]))
    new = out.sequences[0, len(prompt):].tolist()
    assert len(new) == len(noise.rounds) * c.canvas_length  # whole canvases
    return new, noise.rounds


def expected(new: list[int], max_new: int, stops: list[int]):
    """What dlrt returns of the reference's tokens: (tokens, finish_reason, stop_reason)."""
    for i, t in enumerate(new[:max_new]):
        if t in stops:
            return new[:i], "stop", t
    return new[:max_new], "length", None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models(i) -> (reference model, dlrt LLM over its checkpoint, prompt ids [P]) of
    MODELS[i], built once per module."""
    built = {}

    def get(i: int):
        if i not in built:
            seed, window, types, prompt_len = MODELS[i]
            path = tmp_path_factory.mktemp(f"dg-generate-{seed}") / "ckpt"
            ref = reference_model(path, seed, window, types)
            with torch.no_grad():  # a contractive self-conditioning loop (module docstring)
                ref.model.decoder.self_conditioning.down_proj.weight.mul_(SIGNAL_GAIN)
            ref.save_pretrained(path)
            llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=256)
            g = torch.Generator().manual_seed(seed)
            built[i] = ref, llm, torch.randint(0, 128, (prompt_len,), generator=g)
        return built[i]

    return get


@pytest.fixture(params=range(len(MODELS)), ids=[f"seed{m[0]}-window{m[1]}" for m in MODELS])
def pair(models, request):
    return models(request.param)


def compare(pair, options: dict, max_new: int, seed: int, monkeypatch,
            stops: list[int] | None = None) -> list[int]:
    """Run both; dlrt's tokens, stop and rounds must be the reference's. `stops`: the stop ids
    of both (None: the checkpoint's eos ids). The reference's rounds per canvas."""
    ref, llm, prompt = pair
    eos = EOS if stops is None else stops
    new, rounds = reference_generate(ref, prompt, options, max_new, seed, eos, monkeypatch)
    tokens, finish, why = expected(new, max_new, eos)
    extra = {} if stops is None else dict(stop=stops, ignore_eos=True)
    got = llm.generate(prompt.tolist(), max_new_tokens=max_new, seed=seed, **extra, **options)
    assert got.token_ids == tokens
    assert (got.finish_reason, got.stop_reason) == (finish, why)
    assert got.denoise_steps == rounds  # the same canvases, each with the same rounds
    return rounds


@pytest.mark.parametrize("case", list(CASES))
def test_generate_is_the_references(pair, case, monkeypatch):
    options, max_new, early = CASES[case]
    options = {**BASE, **options}
    runs = [compare(pair, options, max_new, seed, monkeypatch) for seed in (0, 7)]
    assert max(map(len, runs)) >= 2  # several canvases (unless an eos id came first)
    rounds = runs[0] + runs[1]
    if early is not None:
        assert (min(rounds) < options["max_denoising_steps"]) == early, rounds


def test_stable_canvases_stop_early_others_at_the_budget(models, monkeypatch):
    """The stop rule with stability (the argmax canvas unchanged for 1 round, then 2) ends
    some canvases of a request early and leaves others to the round budget."""
    for stability in (1, 2):
        options = {**BASE, "entropy_bound": 1e4, "t_min": 0.0, "t_max": 0.1,
                   "max_denoising_steps": 12, "stability_threshold": stability,
                   "confidence_threshold": 1e3}
        rounds = compare(models(2), options, 48, 0, monkeypatch, stops=[])
        assert len(rounds) == 6 and min(rounds) < 12 and max(rounds) == 12, rounds


def test_a_stop_id_inside_a_later_canvas(pair, monkeypatch):
    """A stop id first met inside the second or a later canvas (not at its end): the
    reference ends after that canvas (keeping it whole); dlrt returns the tokens before it."""
    options = {**BASE, "entropy_bound": 1.0}
    new, _ = reference_generate(pair[0], pair[2], options, 40, 5, [], monkeypatch)
    at = next(i for i in range(9, 40) if i % 8 not in (0, 7) and new[i] not in new[:i])
    rounds = compare(pair, options, 40, 5, monkeypatch, stops=[new[at]])
    assert len(rounds) == at // 8 + 1 < 5


def test_the_prompt_in_several_encoder_passes(pair, monkeypatch):
    monkeypatch.setattr(renoise_decoder, "PREFILL_CHUNK", 4)
    compare(pair, {**BASE, "entropy_bound": 0.5}, 16, 11, monkeypatch)


def test_the_scaled_signal_still_decides_tokens(pair, monkeypatch):
    """At SIGNAL_GAIN the self-conditioning signal still changes what is committed: without
    it (every round a canvas's first) the tokens differ, so the comparisons above see it."""
    llm, prompt = pair[1], pair[2].tolist()
    options = dict(BASE, max_new_tokens=32, seed=0, ignore_eos=True)
    with_signal = llm.generate(prompt, **options).token_ids
    monkeypatch.setattr(renoise_decoder.RenoiseProgram, "round",
                        lambda program: program._round())
    assert llm.generate(prompt, **options).token_ids != with_signal
