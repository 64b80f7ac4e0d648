"""device_loop, host_loop and eager commit identical tokens (GPU, marked `gpu`).

The three modes run the same tensor code on the same static buffers; these tests check it end
to end: every strategy, SDAR dense and MoE, LLaDA canvas (also with its prefix and dual KV
caches, the dual one with a vicinity) and dLLM-Var, contexts from 0 to
thousands of tokens, prompts on and off a block boundary, greedy and seeded sampling; LLaDA2
with and without editing; iteration smoothing on the canvas (with and without the caches:
begin = the refresh forward, the WHILE body the window forward) and on the block decoder.
The lm_head is sharpened (x50) so threshold strategies commit varying numbers per round.
"""

from __future__ import annotations

import json

import pytest
import torch

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import preset

pytestmark = pytest.mark.gpu

MODES = ("device_loop", "host_loop", "eager")
STRATEGIES = ("sequential", "low_confidence_static", "low_confidence_dynamic", "threshold",
              "entropy_bounded", "dynamic_pmax", "random", "credit", "hierarchical")


def _llm(path, **kw):
    llm = LLM(path, device="cuda", dtype="bfloat16", **kw)
    head = llm.model.lm_head.weight if hasattr(llm.model, "lm_head") else \
        llm.model.model.transformer.ff_out.weight
    head.data *= 50
    return llm


def _run_modes(llm, prompt, **options):
    out = {}
    for mode in MODES:
        llm.set_execution_mode(mode)
        r = llm.generate(prompt, **options)
        out[mode] = (r.token_ids, r.denoise_steps, r.commit_rounds, r.finish_reason)
    return out


def _assert_same(out):
    ref = out["eager"]
    for mode in MODES:
        assert out[mode] == ref, (mode, out[mode], ref)


def head128(tmp_path_factory, name: str, **fields) -> str:
    """A preset with its config `fields` changed (FlashInfer builds head sizes 64/128/256;
    the tiny presets have 16 or 32), fp32."""
    config, gen = preset(name)
    config.update(fields)
    src = tmp_path_factory.mktemp(f"{name}-src")
    (src / "config.json").write_text(json.dumps(config))
    (src / "generation_config.json").write_text(json.dumps(gen))
    return str(make_checkpoint(src, tmp_path_factory.mktemp(name) / "ckpt", dtype="float32"))


@pytest.fixture(scope="module")
def llada128(tmp_path_factory):
    return head128(tmp_path_factory, "tiny-llada", d_model=512, n_heads=4, n_kv_heads=4)


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    return _llm(tiny_sdar, max_model_len=8192)


@pytest.fixture(scope="module")
def sdar_moe(tiny_sdar_moe):
    return _llm(tiny_sdar_moe, max_model_len=8192)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("prompt_len", [1, 6, 8, 3001, 4096])
def test_sdar_modes_identical(sdar, strategy, prompt_len):
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    out = _run_modes(sdar, prompt, max_new_tokens=24, temperature=0,
                     remasking_strategy=strategy, threshold=0.3, eb_threshold=1.0, seed=5)
    _assert_same(out)
    assert len(out["eager"][0]) == 24


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "threshold", "random"])
@pytest.mark.parametrize("prompt_len", [5, 1024])
def test_sdar_moe_modes_identical(sdar_moe, strategy, prompt_len):
    prompt = [(13 * i + 3) % 150000 for i in range(prompt_len)]
    _assert_same(_run_modes(sdar_moe, prompt, max_new_tokens=16, temperature=0,
                            remasking_strategy=strategy, threshold=0.3, seed=1))


@pytest.mark.parametrize("block_length,steps", [(4, 4), (8, 3), (4, 9)])
def test_block_lengths_and_budgets(sdar, block_length, steps):
    prompt = list(range(1000, 1013))
    _assert_same(_run_modes(sdar, prompt, max_new_tokens=20, temperature=0,
                            block_length=block_length, denoising_steps=steps,
                            remasking_strategy="threshold", threshold=0.5))


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "credit"])
def test_seeded_sampling_identical(sdar, strategy):
    prompt = list(range(500, 517))
    out = _run_modes(sdar, prompt, max_new_tokens=24, temperature=0.8, top_k=50, top_p=0.9,
                     seed=1234, remasking_strategy=strategy, threshold=0.3)
    _assert_same(out)
    other = _run_modes(sdar, prompt, max_new_tokens=24, temperature=0.8, top_k=50, top_p=0.9,
                       seed=99, remasking_strategy=strategy, threshold=0.3)
    assert other["device_loop"][0] != out["device_loop"][0]


@pytest.mark.parametrize("strategy", ["low_confidence_static", "low_confidence_dynamic",
                                      "random", "credit", "hierarchical"])
@pytest.mark.parametrize("block_length", [None, 8])
def test_llada_canvas_modes_identical(tiny_llada, strategy, block_length):
    llm = _llm(tiny_llada)
    _assert_same(_run_modes(llm, list(range(300, 321)), max_new_tokens=28, temperature=0,
                            block_length=block_length, remasking_strategy=strategy,
                            threshold=0.3, seed=2))


@pytest.mark.parametrize("canvas_cache,vicinity", [("prefix", (0, 0)), ("dual", (0, 0)),
                                                   ("dual", (4, 4)), ("dual", (0, 3))])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("strategy,temperature", [("low_confidence_static", 0),
                                                  ("threshold", 0), ("threshold", 0.7)])
@pytest.mark.parametrize("prompt_len", [21, 36, 1500])
def test_llada_canvas_cache_modes_identical(tiny_llada, llada128, canvas_cache, vicinity, backend,
                                            strategy, temperature, prompt_len):
    llm = _llm(tiny_llada if backend == "triton" else llada128, attention_backend=backend,
               max_model_len=4096)
    prompt = [(7 * i + 3) % 126000 for i in range(prompt_len)]
    _assert_same(_run_modes(llm, prompt, max_new_tokens=28, block_length=8,
                            denoising_steps=4, temperature=temperature,
                            remasking_strategy=strategy, threshold=0.3, seed=2,
                            canvas_cache=canvas_cache, vicinity_before=vicinity[0],
                            vicinity_after=vicinity[1]))


SMOOTHING = dict(smoothing=True, cont_weight=0.4, cont_weight_growth=0.05, threshold_decay=0.1)


@pytest.mark.parametrize("canvas_cache,vicinity", [("none", (0, 0)), ("prefix", (0, 0)),
                                                   ("dual", (0, 0)), ("dual", (4, 4))])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("strategy,temperature", [("threshold", 0), ("credit", 0),
                                                  ("hierarchical", 0), ("threshold", 0.7)])
@pytest.mark.parametrize("prompt_len", [21, 1500])
def test_llada_canvas_smoothing_modes_identical(tiny_llada, llada128, canvas_cache, vicinity,
                                                backend, strategy, temperature, prompt_len):
    llm = _llm(tiny_llada if backend == "triton" else llada128, attention_backend=backend,
               max_model_len=4096)
    prompt = [(7 * i + 3) % 126000 for i in range(prompt_len)]
    _assert_same(_run_modes(llm, prompt, max_new_tokens=28, block_length=8,
                            denoising_steps=8, temperature=temperature,
                            remasking_strategy=strategy, threshold=0.3, seed=2,
                            canvas_cache=canvas_cache, vicinity_before=vicinity[0],
                            vicinity_after=vicinity[1], ignore_eos=True, **SMOOTHING))


@pytest.mark.parametrize("strategy", ["threshold", "credit", "hierarchical"])
@pytest.mark.parametrize("prompt_len", [5, 8, 3001])
def test_sdar_smoothing_modes_identical(sdar, strategy, prompt_len):
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    out = _run_modes(sdar, prompt, max_new_tokens=24, block_length=8, temperature=0,
                     remasking_strategy=strategy, threshold=0.3, ignore_eos=True, **SMOOTHING)
    _assert_same(out)
    assert len(out["eager"][0]) == 24


def test_smoothing_graphs_serve_every_value(sdar):
    """One captured graph set per smoothing kind, whatever its values."""
    sdar.set_execution_mode("device_loop")
    opts = dict(max_new_tokens=16, block_length=8, temperature=0, ignore_eos=True,
                remasking_strategy="threshold", smoothing=True)
    sdar.generate(list(range(20)), threshold=0.5, **opts)
    captured = sdar.executor.captures
    for weight, growth, decay in ((0.0, 0.0, 0.0), (1.0, 0.5, 1.0), (0.3, 0.02, 0.02)):
        sdar.generate(list(range(20)), threshold=0.2, cont_weight=weight,
                      cont_weight_growth=growth, threshold_decay=decay, **opts)
    assert sdar.executor.captures == captured


def test_smoothing_rounds_have_no_host_sync(sdar, tiny_llada):
    """The smoothing programs' begin phases and rounds never synchronise with the host: the
    block's folded round and round, the cached canvas's refresh and window round."""
    llada = _llm(tiny_llada)
    cases = [(sdar, dict(block_length=8), "begin_folded"),
             (llada, dict(block_length=8, canvas_cache="dual", vicinity_before=2,
                          vicinity_after=3), "refresh"),
             (llada, dict(block_length=8, canvas_cache="prefix"), "refresh"),
             (llada, dict(block_length=8), "begin")]
    for llm, options, begin in cases:
        llm.set_execution_mode("eager")
        llm.generate(list(range(9)), max_new_tokens=16, temperature=0, ignore_eos=True,
                     remasking_strategy="threshold", smoothing=True, **options)
        prog = llm.decoder.programs[-1]
        assert prog.smoothing is not None
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.inference_mode():
                getattr(prog, begin)()
                prog.round()
                prog.end()
        finally:
            torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "threshold", "sequential",
                                      "credit", "hierarchical"])
@pytest.mark.parametrize("prompt_len", [3, 2000])
def test_dllm_var_modes_identical(tiny_llada, strategy, prompt_len):
    llm = _llm(tiny_llada, decoder="dllm_var")
    prompt = [(5 * i + 1) % 126000 for i in range(prompt_len)]
    _assert_same(_run_modes(llm, prompt, max_new_tokens=32, block_length=8, temperature=0,
                            remasking_strategy=strategy, threshold=0.3))


def test_graphs_are_reused_across_contexts(sdar):
    """One captured block graph serves every context length (no per-length capture)."""
    sdar.set_execution_mode("device_loop")
    opts = dict(max_new_tokens=8, temperature=0, remasking_strategy="sequential")
    sdar.generate(list(range(10)), **opts)
    captured = len(sdar.executor._graphs)
    for n in (37, 700, 2500):
        sdar.generate(list(range(n)), **opts)
    assert len(sdar.executor._graphs) == captured
    assert torch.cuda.is_available()


def test_round_has_no_host_sync(sdar):
    """begin/round/end never synchronise with the host (what makes them capturable)."""
    sdar.set_execution_mode("eager")
    for strategy in ("low_confidence_dynamic", "credit", "hierarchical"):
        sdar.generate(list(range(9)), max_new_tokens=8, temperature=0,
                      remasking_strategy=strategy)
    for prog in sdar.decoder._programs.values():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.inference_mode():  # the state tensors are inference tensors
                prog.begin()
                prog.round()
                prog.end()
        finally:
            torch.cuda.set_sync_debug_mode(0)


# --- token editing (LLaDA2.1): the WHILE node reads only `flag`, whatever the round kind ------

@pytest.fixture(scope="module")
def llada2(tiny_llada2):
    return _llm(tiny_llada2, max_model_len=8192)


@pytest.mark.parametrize("editing_threshold,max_post_steps", [(None, 16), (0.0, 2), (0.5, 16)])
@pytest.mark.parametrize("prompt_len", [5, 40, 1100])
def test_llada2_modes_identical(llada2, editing_threshold, max_post_steps, prompt_len):
    """LLaDA2 (fused sigmoid-routed MoE, partial RoPE) with its own defaults: block 32, the
    threshold rule, and with editing."""
    prompt = [(11 * i + 5) % 150000 for i in range(prompt_len)]
    out = _run_modes(llada2, prompt, max_new_tokens=64, temperature=0, threshold=0.3,
                     ignore_eos=True, editing_threshold=editing_threshold,
                     max_post_steps=max_post_steps)
    _assert_same(out)
    assert len(out["eager"][0]) == 64


@pytest.mark.parametrize("strategy", ["threshold", "hierarchical"])
@pytest.mark.parametrize("prompt_len", [5, 40, 1100])
def test_llada2_smoothing_modes_identical(llada2, strategy, prompt_len):
    """LLaDA2 with its own block (32) and iteration smoothing (DMax-style soft decoding)."""
    prompt = [(11 * i + 5) % 150000 for i in range(prompt_len)]
    out = _run_modes(llada2, prompt, max_new_tokens=64, temperature=0, threshold=0.3,
                     remasking_strategy=strategy, ignore_eos=True, **SMOOTHING)
    _assert_same(out)
    assert len(out["eager"][0]) == 64


@pytest.fixture
def editing_family(monkeypatch):
    """Every family edits (the loop does not depend on the family; SDAR weights stand in)."""
    import dataclasses

    import dlrt.llm

    real = dlrt.llm.family
    monkeypatch.setattr(dlrt.llm, "family",
                        lambda name: dataclasses.replace(real(name), supports_editing=True))


EDITING = [(None, 16), (0.0, 0), (0.0, 3), (0.5, 16)]  # (editing_threshold, max_post_steps)


@pytest.mark.parametrize("editing_threshold,max_post_steps", EDITING)
@pytest.mark.parametrize("strategy", ["threshold", "low_confidence_dynamic"])
@pytest.mark.parametrize("prompt_len", [5, 8, 3001])
def test_editing_modes_identical(sdar, editing_family, editing_threshold, max_post_steps,
                                 strategy, prompt_len):
    prompt = [(7 * i + 11) % 150000 for i in range(prompt_len)]
    out = _run_modes(sdar, prompt, max_new_tokens=32, block_length=8, temperature=0,
                     remasking_strategy=strategy, threshold=0.4, ignore_eos=True,
                     editing_threshold=editing_threshold, max_post_steps=max_post_steps)
    _assert_same(out)
    assert len(out["eager"][0]) == 32


def test_editing_changes_tokens_and_rounds(sdar, editing_family):
    """The editing kind really edits here (so the identities above are not vacuous)."""
    sdar.set_execution_mode("device_loop")
    opts = dict(max_new_tokens=32, block_length=8, temperature=0, ignore_eos=True,
                remasking_strategy="threshold", threshold=0.4)
    prompt = list(range(40, 45))
    off = sdar.generate(prompt, **opts)
    on = sdar.generate(prompt, editing_threshold=0.0, max_post_steps=3, **opts)
    assert on.token_ids != off.token_ids


@pytest.mark.parametrize("editing_threshold", [None, 0.0, 0.3])
def test_editing_sampled_modes_identical(sdar, editing_family, editing_threshold):
    out = _run_modes(sdar, list(range(500, 517)), max_new_tokens=24, block_length=8,
                     temperature=0.8, top_k=50, seed=7, remasking_strategy="threshold",
                     threshold=0.3, editing_threshold=editing_threshold, max_post_steps=2,
                     ignore_eos=True)
    _assert_same(out)


def test_one_editing_graph_serves_every_value(sdar, editing_family):
    sdar.set_execution_mode("device_loop")
    opts = dict(max_new_tokens=16, block_length=8, temperature=0, remasking_strategy="threshold",
                ignore_eos=True)
    sdar.generate(list(range(20)), threshold=0.5, editing_threshold=0.5, **opts)
    captured = sdar.executor.captures
    for et, post, th in ((0.0, 0, 0.1), (1.0, 40, 0.9), (0.25, 3, 0.0)):
        sdar.generate(list(range(20)), threshold=th, editing_threshold=et, max_post_steps=post,
                      **opts)
    assert sdar.executor.captures == captured


def test_editing_round_has_no_host_sync(sdar, editing_family):
    sdar.set_execution_mode("eager")
    sdar.generate(list(range(9)), max_new_tokens=16, block_length=8, temperature=0,
                  editing_threshold=0.0, ignore_eos=True)
    prog = next(p for p in sdar.decoder.programs if p.kind.editing)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            prog.begin_folded()
            prog.round()
            prog.end()
    finally:
        torch.cuda.set_sync_debug_mode(0)
