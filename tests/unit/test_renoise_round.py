"""`denoise_canvas_round` against transformers' own DiffusionGemma denoising loop: the
reference's `_denoising_step` (its logits processor, `EntropyBoundSampler`,
`StableAndConfidentStoppingCriteria`), with its two draws (`torch.multinomial` and the
sampler's `initialize_canvas`) patched to the documented counter-based noise, and both fed the
same logits round after round. Canvases, accepted positions, argmax canvases, the
self-conditioning signal, the stop and the committed canvas are identical (fp32, CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dlrt.decoding import rng
from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve
from dlrt.decoding.renoise import schedule_temperature
from dlrt.decoding.renoise_round import CanvasState, denoise_canvas_round
from dlrt.ops import reference

RENOISE = DecoderDefaults(block_length=16, remasking_strategy="sequential", renoise=True)
N_POS, VOCAB, START = 16, 64, 37


def reference_module():
    return pytest.importorskip("transformers.models.diffusion_gemma.generation_diffusion_gemma")


def documented_canvas(seed, key, positions, vocab):
    """The README's canvas tokens: min(floor(u * V), V - 1), u on stream 2."""
    u = rng.uniform(seed, 2, key, positions, 1)[:, 0]
    return torch.clamp(torch.floor(u * vocab).to(torch.int64), max=vocab - 1)


def logits_sequence(seed, rounds, growth, jitter):
    """Per round [n, V] fp32 logits: a fixed preference that sharpens by `growth` per round,
    plus fresh noise of size `jitter` (large jitter: the argmax keeps changing)."""
    gen = torch.Generator().manual_seed(1000 + seed)
    base = torch.randn(N_POS, VOCAB, generator=gen) * 2
    return [base * (1 + growth * r) + jitter * torch.randn(N_POS, VOCAB, generator=gen)
            for r in range(rounds)]


def reference_run(options, logits, seed, positions, monkeypatch, embed_dtype):
    """The reference's canvas loop (`generate` 1.b-1.c) on the given logits; per round, what
    its decoder was given and what the step left."""
    ref = reference_module()
    config = ref.DiffusionGemmaGenerationConfig(
        max_denoising_steps=options["max_denoising_steps"],
        sampler_config=ref.EntropyBoundSamplerConfig(options["entropy_bound"]),
        t_min=options["t_min"], t_max=options["t_max"],
        stability_threshold=options["stability_threshold"],
        confidence_threshold=options["confidence_threshold"])
    model = SimpleNamespace(
        config=SimpleNamespace(canvas_length=N_POS,
                               text_config=SimpleNamespace(vocab_size=VOCAB)),
        model=SimpleNamespace(decoder=SimpleNamespace(
            embed_tokens=SimpleNamespace(weight=torch.zeros(1, dtype=embed_dtype)))))
    mixin = ref.DiffusionGemmaGenerationMixin
    sampler = mixin._prepare_sampler(model, config)
    processors = mixin._prepare_logits_processor(model, config)
    stopping = mixin._prepare_diffusion_stopping_criteria(model, config)
    now = {"round": 0, "key": 0}

    def multinomial(probs, num_samples):
        assert num_samples == 1 and probs.shape == (N_POS, VOCAB)
        u = rng.uniform(seed, rng.SAMPLE_STREAM, now["round"], positions, VOCAB)
        return torch.argmax(probs / -torch.log(u), dim=-1)[:, None]

    monkeypatch.setattr(torch, "multinomial", multinomial)
    sampler.initialize_canvas = lambda batch_size, device: documented_canvas(
        seed, now["key"], positions, VOCAB)[None]
    steps = options["max_denoising_steps"]
    seen = []

    def decoder_forward(decoder_input_ids, self_conditioning_logits, **_):
        seen.append((decoder_input_ids[0].clone(), self_conditioning_logits))
        return SimpleNamespace(logits=logits[steps - cur_step][None])

    canvas = sampler.initialize_canvas(1, "cpu")  # key 0
    argmax, self_cond = canvas, None
    finished = torch.zeros(1, dtype=torch.bool)
    stopping.reset()
    rounds = []
    for cur_step in reversed(range(1, steps + 1)):
        now["round"] = steps - cur_step
        now["key"] = now["round"] + 1  # the renoise of this round
        canvas, argmax, self_cond, finished = mixin._denoising_step(
            model, decoder_forward=decoder_forward, current_canvas=canvas, argmax_canvas=argmax,
            input_ids=torch.zeros(1, 3, dtype=torch.int64),
            decoder_position_ids=positions[None], self_conditioning_logits=self_cond,
            mask_mapping=None, cache=None, finished_denoising=finished, cur_step=cur_step,
            sampler=sampler, logits_processor=processors,
            diffusion_stopping_criteria=stopping)
        rounds.append(dict(input=seen[-1], canvas=canvas[0].clone(), argmax=argmax[0].clone(),
                           accepted=sampler.accepted_token_mask[0].clone(),
                           self_cond=self_cond[0].clone(), finished=bool(finished.item())))
        if finished.all():
            break
    return rounds, argmax[0]


CASES = {  # options, logits (growth, jitter), whether the canvas stops before its last round
    "reference defaults, noisy logits": (dict(), (0.0, 1.0), False),
    "tiny bound, confident early": (dict(entropy_bound=1e-3, confidence_threshold=0.5),
                                    (3.0, 0.05), True),
    "large bound, no stability needed": (dict(entropy_bound=10.0, stability_threshold=0,
                                              confidence_threshold=0.2), (1.0, 0.05), True),
    "accept all, stable for 3 rounds": (dict(entropy_bound=1e4, stability_threshold=3,
                                             confidence_threshold=1e9), (0.5, 0.01), True),
    "stable late": (dict(entropy_bound=0.5, stability_threshold=2, confidence_threshold=0.3,
                         t_min=0.0, t_max=2.0), (0.4, 0.3), None),  # rounds 10, 10, 12
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_rounds_match_the_reference_loop(case, seed, monkeypatch):
    options, (growth, jitter), early = CASES[case]
    options = {**dict(max_denoising_steps=12, entropy_bound=0.1, t_min=0.4, t_max=0.8,
                      stability_threshold=1, confidence_threshold=0.005), **options}
    steps = options["max_denoising_steps"]
    logits = logits_sequence(seed, steps, growth, jitter)
    positions = torch.arange(START, START + N_POS)
    expect, committed = reference_run(options, logits, seed, positions, monkeypatch,
                                      torch.float32)

    params = resolve(DecodingOptions.from_kwargs({**options, "seed": seed}), RENOISE, {}, (1,),
                     64, 0)
    state = CanvasState(N_POS, VOCAB, torch.device("cpu"))
    state.set_values(params)
    state.start_canvas(positions)
    for r, want in enumerate(expect):
        assert state.flag.item() == 1
        canvas_in, self_cond_in = want["input"]
        assert torch.equal(state.canvas, canvas_in), r
        if r == 0:
            assert self_cond_in is None and state.round.item() == 0
        else:
            assert torch.equal(state.self_cond, self_cond_in[0]), r
        denoise_canvas_round(logits[r], state, positions)
        assert torch.equal(state.accepted, want["accepted"]), r
        assert torch.equal(state.canvas, want["canvas"]), r
        assert torch.equal(state.argmax, want["argmax"]), r
        assert torch.equal(state.self_cond, want["self_cond"]), r
        assert state.stopped.item() == want["finished"], r
        assert state.round.item() == r + 1
    assert state.flag.item() == 0 and not state.fault.item()
    assert torch.equal(state.argmax, committed)
    if early is not None:
        assert (len(expect) < steps) == early, len(expect)
    assert 0 < int(torch.stack([w["accepted"] for w in expect]).sum()) \
        <= N_POS * len(expect)


def test_self_conditioning_in_the_embedding_dtype(monkeypatch):
    """The signal is the divided logits cast to the embedding dtype, as the reference casts
    them (`processed_logits.to(embeddings_dtype)`)."""
    options = dict(max_denoising_steps=6, entropy_bound=0.3, t_min=0.2, t_max=1.0,
                   stability_threshold=1, confidence_threshold=0.005)
    logits = logits_sequence(5, 6, 0.2, 0.5)
    positions = torch.arange(START, START + N_POS)
    expect, _ = reference_run(options, logits, 5, positions, monkeypatch, torch.bfloat16)
    params = resolve(DecodingOptions.from_kwargs({**options, "seed": 5}), RENOISE, {}, (1,),
                     64, 0)
    state = CanvasState(N_POS, VOCAB, torch.device("cpu"), self_cond_dtype=torch.bfloat16)
    state.set_values(params)
    state.start_canvas(positions)
    for r, want in enumerate(expect):
        denoise_canvas_round(logits[r], state, positions)
        assert want["self_cond"].dtype == torch.bfloat16
        assert torch.equal(state.self_cond, want["self_cond"]), r
        assert torch.equal(state.canvas, want["canvas"]), r


def run_canvas(seed, logits, draw_op=None, **options):
    params = resolve(DecodingOptions.from_kwargs({**options, "seed": seed}), RENOISE, {}, (1,),
                     64, 0)
    state = CanvasState(N_POS, VOCAB, torch.device("cpu"))
    state.set_values(params)
    positions = torch.arange(START, START + N_POS)
    state.start_canvas(positions)
    canvases = [state.canvas.clone()]
    while state.flag.item():
        denoise_canvas_round(logits[state.round.item()], state, positions,
                             *([draw_op] if draw_op else []))
        canvases.append(state.canvas.clone())
    return state, canvases


def test_the_reference_ops_draw_is_the_rounds_default():
    logits = logits_sequence(3, 10, 0.3, 0.5)
    a, ca = run_canvas(3, logits, max_denoising_steps=10)
    b, cb = run_canvas(3, logits, reference.OPS.denoiser_draw, max_denoising_steps=10)
    assert all(torch.equal(x, y) for x, y in zip(ca, cb, strict=True))
    assert torch.equal(a.argmax, b.argmax)


def test_a_new_canvas_starts_afresh_and_the_seed_decides():
    logits = logits_sequence(4, 8, 0.3, 0.5)
    a, ca = run_canvas(4, logits, max_denoising_steps=8)
    again, c_again = run_canvas(4, logits, max_denoising_steps=8)
    other, c_other = run_canvas(5, logits, max_denoising_steps=8)
    assert all(torch.equal(x, y) for x, y in zip(ca, c_again, strict=True))
    assert not torch.equal(ca[0], c_other[0])
    a.start_canvas(torch.arange(START, START + N_POS))
    assert a.round.item() == 0 and a.flag.item() == 1 and not a.self_cond.any()
    assert torch.equal(a.canvas, ca[0])


def test_non_finite_logits_end_the_canvas_with_a_fault():
    logits = logits_sequence(6, 8, 0.3, 0.5)
    logits[1][3, 5] = float("nan")
    state, _ = run_canvas(6, logits, max_denoising_steps=8, confidence_threshold=0.005)
    assert state.fault.item() and state.round.item() == 2 and state.flag.item() == 0


def test_set_values_needs_a_renoising_request():
    params = resolve(DecodingOptions(), DecoderDefaults(4, "sequential"), {}, (1,), 8, 0)
    with pytest.raises(ValueError, match="renoising"):
        CanvasState(4, 8, torch.device("cpu")).set_values(params)


def test_a_round_reads_no_tensor_on_the_host():
    """What a captured round (a CUDA graph's WHILE body) needs, checked on the CPU: on the meta
    device, where tensors hold no values, a round with the request values as 0-d tensors runs
    to the end (no `.item()`, no Python branch on a tensor: either raises there) and writes
    every buffer in place, keeping its shape, dtype and device (a graph replays the same
    addresses)."""
    meta = torch.device("meta")
    params = resolve(DecodingOptions.from_kwargs({"seed": 3}), RENOISE, {}, (1,), 64, 0)
    state = CanvasState(N_POS, VOCAB, meta, torch.bfloat16)
    state.set_values(params)
    positions = torch.arange(START, START + N_POS, device=meta)
    state.start_canvas(positions)
    with pytest.raises(RuntimeError, match="meta"):
        state.flag.item()  # what a host read of a tensor does here
    before = [(id(t), t.shape, t.dtype) for t in state.tensors()]
    for _ in range(2):
        denoise_canvas_round(torch.empty(N_POS, VOCAB, device=meta), state, positions)
    assert [(id(t), t.shape, t.dtype) for t in state.tensors()] == before
    assert all(t.device == meta for t in state.tensors())


def recording(draw_op, entropies):
    """`draw_op` that also keeps each round's entropies."""
    def draw(*args):
        out = draw_op(*args)
        entropies.append(out[2].clone())
        return out
    return draw


@pytest.mark.parametrize("seed, options", [
    (7, dict(max_denoising_steps=6)),
    (8, dict(max_denoising_steps=9, entropy_bound=2.0, stability_threshold=0,
             confidence_threshold=1.5, t_min=0.1, t_max=1.5)),
])
def test_the_draw_kernel_gives_the_reference_rounds_state(seed, options):
    """The ops table's Triton `denoiser_draw` (the interpreter on the CPU), given the round's
    temperature as a device value and `self_cond` to write: after every round the state of
    the reference round (canvas, argmax, accepted, self-conditioning signal, stability, stop,
    flag), bit for bit; its entropies within the kernel's stated 1e-6 (1 + H) nats of the
    fp64 entropy and 2e-5 nats of the reference's."""
    pytest.importorskip("triton")
    from dlrt.ops import triton as triton_ops

    logits = logits_sequence(seed, options["max_denoising_steps"], 0.3, 0.5)
    params = resolve(DecodingOptions.from_kwargs({**options, "seed": seed}), RENOISE, {},
                     (1,), 64, 0)
    positions = torch.arange(START, START + N_POS)
    want_h, got_h, accepted = [], [], []
    ref, ker = (CanvasState(N_POS, VOCAB, torch.device("cpu")) for _ in range(2))
    for state in (ref, ker):
        state.set_values(params)
        state.start_canvas(positions)
    draws = recording(reference.OPS.denoiser_draw, want_h), \
        recording(triton_ops.OPS.denoiser_draw, got_h)
    while ref.flag.item():
        r = ref.round.item()
        for state, draw in zip((ref, ker), draws, strict=True):
            denoise_canvas_round(logits[r], state, positions, draw)
        for a, b in zip(ref.tensors(), ker.tensors(), strict=True):
            assert torch.equal(a, b), r
        accepted.append(ker.accepted.clone())
        t = schedule_temperature(params.renoise.t_min, params.renoise.t_max,
                                 params.renoise.max_denoising_steps, r)
        exact = torch.distributions.Categorical(
            logits=logits[r].double() / t.double(), validate_args=False).entropy()
        assert ((got_h[r].double() - exact).abs() <= 1e-6 * (1 + exact)).all(), r
        assert float((got_h[r] - want_h[r]).abs().max()) < 2e-5, r
    assert 1 < len(got_h) == ker.round.item()
    assert 0 < int(torch.stack(accepted).sum()) < N_POS * len(accepted)  # both branches ran


def gpu_draw_op(name):
    if name == "triton":
        pytest.importorskip("triton")
        from dlrt.ops.triton import denoiser_draw

        return denoiser_draw
    return reference.denoiser_draw


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["reference", "triton"])
def test_a_captured_round_replays_as_the_eager_round(op):
    """One round captured into a CUDA graph (request values and round counter read from the
    state), replayed round after round on fresh logits, gives the eager rounds' state bit for
    bit, and stops on the same round; the eager round never waits for the host (CUDA's sync
    debug mode raises on a sync), with the reference draw and with the ops table's kernel."""
    draw_op = gpu_draw_op(op)
    dev = torch.device("cuda")
    n, vocab, steps = 64, 4096, 16
    gen = torch.Generator(device=dev).manual_seed(0)
    base = torch.randn(n, vocab, device=dev, generator=gen) * 2
    logits = [base * (1 + 8 * r) + 0.3 * torch.randn(n, vocab, device=dev, generator=gen)
              for r in range(steps)]
    positions = torch.arange(1000, 1000 + n, device=dev)
    params = resolve(DecodingOptions.from_kwargs(dict(
        seed=11, max_denoising_steps=steps, entropy_bound=0.5, stability_threshold=2,
        confidence_threshold=0.2)), RENOISE, {}, (1,), 64, 0)
    eager, graphed = (CanvasState(n, vocab, dev, torch.bfloat16) for _ in range(2))
    static = torch.zeros(n, vocab, device=dev)
    for state in (eager, graphed):
        state.set_values(params)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graphed.start_canvas(positions)
        denoise_canvas_round(static, graphed, positions, draw_op)  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        denoise_canvas_round(static, graphed, positions, draw_op)
    eager.start_canvas(positions)
    graphed.start_canvas(positions)
    rounds = 0
    while eager.flag.item():
        torch.cuda.set_sync_debug_mode("error")
        try:
            denoise_canvas_round(logits[rounds], eager, positions, draw_op)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        static.copy_(logits[rounds])
        graph.replay()
        rounds += 1
        for a, b in zip(eager.tensors(), graphed.tensors(), strict=True):
            assert torch.equal(a, b), rounds
    assert graphed.flag.item() == 0 and 1 < rounds < steps
