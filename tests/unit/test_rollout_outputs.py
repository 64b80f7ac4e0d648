"""Rollout outputs through `LLM` on the tiny presets: `step_map` (per generated token, the round
of its block or canvas that wrote it last) and, with `logprobs=True`, each token's
log-probability under the distribution its round drew it from with its `top_logprobs`
alternatives: values by hand, against the model's own logits at the commit round, the same
in the three execution modes (the graph modes simulated on the CPU: each captured part
replayed as a call after the executor's own warm-up) for every decoder family, reproducible
by seed, and computed only when asked."""

from __future__ import annotations

import math

import pytest
import torch
from cpu_graph_modes import simulate

import dlrt.runtime.decoder
import dlrt.runtime.renoise_decoder
from dlrt import LLM
from dlrt.decoding.renoise import schedule_temperature
from dlrt.errors import OptionError

B = 4
MODES = ("eager", "host_loop", "device_loop")


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    return LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def llada(tiny_llada):
    return LLM(tiny_llada, dtype="float32")


def _outputs(r):
    return r.token_ids, r.denoise_steps, r.step_map, r.logprobs


# --- step_map by hand ---------------------------------------------------------------------------

@pytest.mark.parametrize("prompt_len,steps,want", [
    (4, 2, [0, 0, 1, 1] * 3),  # block-aligned prompt: quota 2 per round
    (5, 2, [0, 0, 1] + [0, 0, 1, 1] * 2),  # one fixed prompt token leads block 0
    (4, 4, [0, 1, 2, 3] * 3),
])
def test_step_map_of_sequential_blocks_by_hand(sdar, prompt_len, steps, want):
    """`sequential` commits the leftmost k masked positions per round (k = B / T)."""
    r = sdar.generate(list(range(1000, 1000 + prompt_len)), max_new_tokens=len(want),
                      remasking_strategy="sequential", denoising_steps=steps, ignore_eos=True)
    assert r.step_map == want and r.commit_rounds == want
    blocks = list(sdar.stream(list(range(1000, 1000 + prompt_len)), max_new_tokens=len(want),
                              remasking_strategy="sequential", denoising_steps=steps,
                              ignore_eos=True))
    assert [x for b in blocks for x in b.step_map] == want
    assert r.to_dict()["step_map"] == want


@pytest.mark.parametrize("decoder", ["canvas", "dllm_var"])
def test_step_map_of_llada_blocks_by_hand(tiny_llada, decoder):
    """The canvas's sub-blocks and dLLM-Var's blocks (its round 0 in the look-ahead forward)."""
    llm = LLM(tiny_llada, dtype="float32", decoder=decoder)
    r = llm.generate(list(range(300, 305)), max_new_tokens=12, block_length=4,
                     denoising_steps=2, remasking_strategy="sequential", ignore_eos=True)
    assert r.step_map == [0, 0, 1, 1] * 3 and r.denoise_steps == [2, 2, 2]


def test_step_map_of_a_renoising_canvas_is_its_last_round(tiny_diffusion_gemma):
    """DiffusionGemma commits the argmax canvas of its last round: every token's last write."""
    llm = LLM(str(tiny_diffusion_gemma), device="cpu", max_model_len=512)
    r = llm.generate("import os\n", max_new_tokens=37, max_denoising_steps=6,
                     entropy_bound=0.5, seed=3, ignore_eos=True)
    want = [steps - 1 for steps, n in zip(r.denoise_steps, (16, 16, 5), strict=True)
            for _ in range(n)]
    assert r.step_map == want


# --- the three execution modes ------------------------------------------------------------------

FAMILIES = {
    "sdar": ("tiny_sdar", {}, list(range(700, 706)),
             dict(max_new_tokens=14, temperature=0.8, top_k=20, seed=5, threshold=0.05)),
    "llada-canvas": ("tiny_llada", {}, list(range(300, 309)),
                     dict(max_new_tokens=16, block_length=8, denoising_steps=4, temperature=0.7,
                          seed=2, remasking_strategy="low_confidence_static")),
    "llada2-editing": ("tiny_llada2", {}, list(range(40, 48)),
                       dict(max_new_tokens=16, block_length=8, temperature=0,
                            remasking_strategy="threshold", threshold=0.3,
                            editing_threshold=0.0, max_post_steps=2, ignore_eos=True)),
    "dllm_var": ("tiny_llada", {"decoder": "dllm_var"}, list(range(300, 305)),
                 dict(max_new_tokens=16, block_length=8, temperature=0.9, seed=4,
                      remasking_strategy="low_confidence_dynamic", threshold=0.05)),
    "diffusion_gemma": ("tiny_diffusion_gemma", {"max_model_len": 512}, "import sys\n",
                        dict(max_new_tokens=20, max_denoising_steps=5, entropy_bound=0.5,
                             seed=3, ignore_eos=True)),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_execution_modes_give_the_same_step_map_and_logprobs(name, request, monkeypatch):
    fixture, engine, prompt, options = FAMILIES[name]
    llm = LLM(str(request.getfixturevalue(fixture)), device="cpu", dtype="float32", **engine)
    if name == "llada2-editing":
        llm.model.lm_head.weight.data.mul_(50.0)  # confidences spread: edits happen
    out = {}
    for mode in MODES:
        with monkeypatch.context() as m:
            if mode != "eager":
                simulate(llm.executor, mode, m)
            before = llm.executor.captures
            out[mode] = [_outputs(llm.generate(prompt, logprobs=True, top_logprobs=5,
                                               **options)) for _ in range(2)]
            assert (llm.executor.captures > before) == (mode != "eager")
            llm.executor._graphs.clear()
    assert out["host_loop"] == out["eager"] and out["device_loop"] == out["eager"]
    tokens, _, step_map, logprobs = out["eager"][0]
    assert len(logprobs) == len(tokens) == len(step_map) == options["max_new_tokens"]
    assert all(math.isfinite(x.logprob) and x.logprob <= 0 for x in logprobs)
    assert [x.token_id for x in logprobs] == tokens


# --- against the model's logits at the commit round ---------------------------------------------

def _check_against(logits: torch.Tensor, token: int, got, mask: int | None, temperature: float,
                   top_k: int) -> None:
    """`got` (a TokenLogprob) against logits [V] of the round that wrote `token`."""
    x = logits.double().clone()
    if mask is not None:
        x[mask] = -math.inf
    if temperature:
        x = x / temperature
    if top_k:
        x[x < x.topk(top_k).values[-1]] = -math.inf
    lp = torch.log_softmax(x, dim=-1)
    assert got.logprob == pytest.approx(lp[token].item(), abs=2e-4)
    top = [t.logprob for t in got.top_logprobs]
    assert top == sorted(top, reverse=True)
    assert top == pytest.approx(lp.sort(descending=True).values[: len(top)].tolist(), abs=2e-4)
    if top and got.logprob > top[-1] + 1e-4:  # in the top k: listed with its own logprob
        assert any(t.token_id == token and t.logprob == got.logprob for t in got.top_logprobs)


@pytest.mark.parametrize("options", [
    dict(temperature=0, remasking_strategy="low_confidence_dynamic", threshold=0.05),
    dict(temperature=0.8, top_k=30, seed=9, remasking_strategy="low_confidence_static"),
])
def test_sdar_logprobs_are_the_log_softmax_of_the_commit_round(sdar, options):
    """Each block position's state at round r is rebuilt from the step_map (positions written
    before r hold their tokens, the others the mask) and forwarded by the model over the whole
    sequence, block-causally (what the cached rounds compute)."""
    prompt = list(range(2000, 2006))  # 2 fixed prompt tokens lead block 0
    k = 6
    r = sdar.generate(prompt, max_new_tokens=10, logprobs=True, top_logprobs=k,
                      ignore_eos=True, **options)
    assert len(set(r.step_map)) > 1
    mask = sdar.config.mask_token_id
    start, fixed = (len(prompt) // B) * B, prompt[(len(prompt) // B) * B:]
    done = prompt[:start]
    blocks = [fixed + r.token_ids[:B - len(fixed)]]
    blocks += [r.token_ids[i:i + B] for i in range(B - len(fixed), len(r.token_ids), B)]
    rounds = [[-1] * len(fixed) + r.step_map[:B - len(fixed)]]
    rounds += [r.step_map[i:i + B] for i in range(B - len(fixed), len(r.step_map), B)]
    j = 0
    for block, when in zip(blocks, rounds, strict=True):
        for pos, rnd in enumerate(when):
            if rnd < 0:
                continue
            state = [t if w < rnd else mask for t, w in zip(block, when, strict=True)]
            ids = torch.tensor(done + state)
            logits = sdar.runner.forward_at(ids, 0, chunk_block=B)[len(done) + pos]
            _check_against(logits, block[pos], r.logprobs[j], mask,
                           options["temperature"], options.get("top_k", 0))
            assert len(r.logprobs[j].top_logprobs) == k
            j += 1
        done += block
    assert j == len(r.token_ids)


def test_llada_canvas_logprobs_are_the_log_softmax_of_the_commit_round(llada):
    prompt = list(range(300, 305))
    r = llada.generate(prompt, max_new_tokens=8, denoising_steps=4, temperature=0,
                       remasking_strategy="low_confidence_static", logprobs=True,
                       top_logprobs=3)
    mask = llada.config.mask_token_id
    assert sorted(set(r.step_map)) == [0, 1, 2, 3]
    for i, (token, rnd) in enumerate(zip(r.token_ids, r.step_map, strict=True)):
        canvas = prompt + [t if w < rnd else mask
                           for t, w in zip(r.token_ids, r.step_map, strict=True)]
        logits = llada.runner.forward_at(torch.tensor(canvas), 0, chunk_block=None)
        _check_against(logits[len(prompt) + i], token, r.logprobs[i], mask, 0, 0)


def test_an_edit_is_the_last_write(tiny_llada2, monkeypatch):
    """LLaDA2.1 token editing: a rewritten token's step_map is its edit's round and its
    logprob that round's (the rounds seen through `denoise_round`)."""
    llm = LLM(tiny_llada2, dtype="float32")
    llm.model.lm_head.weight.data.mul_(50.0)
    calls = []
    real = dlrt.runtime.decoder.denoise_round

    def spy(spec, logits, tokens, masked, positions, round_idx, *args, **kw):
        out = real(spec, logits, tokens, masked, positions, round_idx, *args, **kw)
        calls.append((int(round_idx), logits.clone(), out[0].clone(), out[2].clone()))
        return out

    monkeypatch.setattr(dlrt.runtime.decoder, "denoise_round", spy)
    r = llm.generate(list(range(40, 48)), max_new_tokens=16, block_length=8, temperature=0,
                     remasking_strategy="threshold", threshold=0.3, editing_threshold=0.0,
                     max_post_steps=2, ignore_eos=True, logprobs=True)
    starts = [i for i, c in enumerate(calls) if c[0] == 0] + [len(calls)]
    edits = 0
    for b, (lo, hi) in enumerate(zip(starts, starts[1:], strict=False)):
        block = calls[lo:hi]
        for pos in range(8):
            writes = [c for c in block if c[3][pos]]
            edits += len(writes) - 1
            rnd, logits, after, _ = writes[-1]
            j = 8 * b + pos
            assert r.step_map[j] == rnd and r.token_ids[j] == after[pos]
            _check_against(logits[pos], r.token_ids[j], r.logprobs[j], llm.config.mask_token_id,
                           0, 0)
    assert edits > 0  # the rule really rewrote tokens here


def test_renoise_logprobs_are_those_of_the_last_rounds_divided_logits(tiny_diffusion_gemma,
                                                                      monkeypatch):
    llm = LLM(str(tiny_diffusion_gemma), device="cpu", max_model_len=512)
    last = {}
    real = dlrt.runtime.renoise_decoder.denoise_canvas_round

    def spy(logits, state, positions, *args):
        t = schedule_temperature(state.t_min, state.t_max, state.steps, state.round)
        last["x"] = (logits.float() / t).clone()
        real(logits, state, positions, *args)

    monkeypatch.setattr(dlrt.runtime.renoise_decoder, "denoise_canvas_round", spy)
    r = llm.generate("def f(x):", max_new_tokens=16, max_denoising_steps=5,
                     entropy_bound=0.5, seed=1, logprobs=True, top_logprobs=4, ignore_eos=True)
    assert len(r.denoise_steps) == 1
    x = last["x"]
    assert r.token_ids == x.argmax(-1).tolist()
    for i, token in enumerate(r.token_ids):
        _check_against(x[i], token, r.logprobs[i], None, 0, 0)
        assert r.logprobs[i].top_logprobs[0].token_id == token


# --- seeds, cost, options -----------------------------------------------------------------------

def test_seeds_give_distinct_rollouts_and_a_seed_repeats_one(sdar):
    opts = dict(max_new_tokens=12, temperature=1.0, logprobs=True, top_logprobs=2,
                remasking_strategy="low_confidence_dynamic", threshold=0.05, ignore_eos=True)
    prompt = list(range(500, 507))
    runs = {seed: [_outputs(sdar.generate(prompt, seed=seed, **opts)) for _ in range(2)]
            for seed in (1, 2, 3)}
    for seed, (a, b) in runs.items():
        assert a == b, seed
    firsts = [runs[s][0] for s in (1, 2, 3)]
    assert len({(tuple(t), tuple(m)) for t, _, m, _ in firsts}) == 3


def test_logprobs_are_computed_only_when_asked_and_change_no_token(sdar):
    opts = dict(max_new_tokens=12, temperature=0.9, seed=4, ignore_eos=True)
    prompt = list(range(800, 806))
    off = sdar.generate(prompt, **opts)
    on = sdar.generate(prompt, logprobs=True, **opts)
    assert off.logprobs is None and on.logprobs is not None
    assert all(x.top_logprobs == [] for x in on.logprobs)  # top_logprobs defaults to 0
    assert (off.token_ids, off.step_map) == (on.token_ids, on.step_map)
    assert all(b.logprobs is None for b in sdar.stream(prompt, **opts))
    kinds = {p.kind.logprobs: p.state.logprobs for p in sdar.decoder.programs
             if p.kind.sampling.greedy is False}
    assert kinds[False] is None and kinds[True] is not None  # one program each


@pytest.mark.parametrize("options,error", [
    (dict(logprobs=True, top_logprobs=21), r"^top_logprobs=21 must be in \[0, 20\]"),
    (dict(logprobs=True, top_logprobs=-1), r"^top_logprobs=-1 must be in \[0, 20\]"),
    (dict(top_logprobs=3), r"^top_logprobs=3 needs logprobs=True"),
    (dict(logprobs=False, top_logprobs=0), r"^top_logprobs=0 needs logprobs=True"),
    (dict(logprobs="yes"), r"^logprobs must be true or false"),
    (dict(logprobs=True, top_logprobs=2.0), r"^top_logprobs must be an integer"),
])
def test_bad_logprob_options_are_named(sdar, options, error, monkeypatch):
    monkeypatch.setattr(sdar.decoder, "decode", lambda *a: pytest.fail("decoded"))
    with pytest.raises(OptionError, match=error):
        sdar.generate([1, 2, 3], max_new_tokens=4, **options)
