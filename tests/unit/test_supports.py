"""Parts say what they support: each attention backend, decoder and the persistent round
answers `supports(...)` with None or its reason, and the registries and `EngineConfig.resolve`
ask the part instead of holding its rules. The persistent round reads a family's weights by the
names on its `Family` record."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dlrt import LLM
from dlrt.attention import flashinfer as flashinfer_module
from dlrt.attention.base import CHUNK_KV, LAYER_SHAPES, SLIDING_WINDOW
from dlrt.attention.flashinfer import FlashInferBackend
from dlrt.attention.registry import check_backend, default_backend
from dlrt.attention.sdpa import SDPABackend
from dlrt.attention.triton import TritonBackend
from dlrt.checkpoint.presets import preset
from dlrt.decoding.options import DecodingOptions
from dlrt.engine.config import EngineConfig
from dlrt.engine.engine import Engine
from dlrt.errors import OptionError
from dlrt.models.llada import LLADA
from dlrt.models.llada.config import llada_config
from dlrt.models.registry import family
from dlrt.models.sdar import SDAR
from dlrt.models.sdar.config import sdar_config
from dlrt.models.sdar.model import SDARForCausalLM
from dlrt.ops import get_ops
from dlrt.ops.reference import KV_FP8
from dlrt.runtime.block_decoder import BlockDecoder
from dlrt.runtime.canvas_decoder import CanvasDecoder
from dlrt.runtime.decoders import decoder_for
from dlrt.runtime.lookahead_decoder import LookaheadDecoder
from dlrt.runtime.persistent import kernel as persistent_kernel
from dlrt.runtime.persistent import plan as plan_module
from dlrt.runtime.persistent.kernel import PersistentRounds
from dlrt.runtime.persistent.plan import build_plan

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16


def test_attention_backends_name_their_reason(monkeypatch):
    why = SDPABackend.supports(CPU, F32, "device_loop")
    assert "execution_mode 'device_loop' needs a graph-capturable" in why and "'sdpa'" in why
    assert SDPABackend.supports(CPU, F32, "eager", 16, KV_FP8) is None
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "'triton' needs a CUDA device" in TritonBackend.supports(CPU, F32, "eager")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert TritonBackend.supports(CPU, F32, "host_loop", 16, KV_FP8) is None
    assert "does not read an FP8 KV cache" in FlashInferBackend.supports(CUDA, BF16, "eager",
                                                                         128, KV_FP8)
    if not torch.cuda.is_available():
        assert "'flashinfer' needs a CUDA GPU" in FlashInferBackend.supports(CPU, BF16, "eager")


def test_backends_name_the_attention_needs_they_do_not_serve(monkeypatch):
    """A sliding window, per-layer head shapes and the chunk's K/V beside the cache
    (DiffusionGemma): SDPA and Triton serve them (Triton not with an FP8 cache, and says so);
    FlashInfer says which it does not serve. The default on a GPU is Triton then (SDPA with
    an FP8 cache)."""
    needs = (SLIDING_WINDOW, LAYER_SHAPES, CHUNK_KV)
    assert SDPABackend.supports(CPU, F32, "eager", 16, None, needs) is None
    assert SDPABackend.supports(CPU, F32, "eager", 16, KV_FP8, needs) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for mode in ("eager", "host_loop", "device_loop"):
        assert TritonBackend.supports(CPU, F32, mode, 256, None, needs) is None
    why = TritonBackend.supports(CPU, F32, "eager", 256, KV_FP8, needs)
    assert why.startswith("kv_cache_dtype='fp8' with attention backend 'triton' is not served "
                          "for a model whose decoder writes nothing") and "'sdpa'" in why
    assert TritonBackend.supports(CPU, F32, "eager", 256, KV_FP8, needs[:2]) is None
    assert TritonBackend.supports(CPU, F32, "eager", 16) is None  # no needs: as before
    monkeypatch.setattr(flashinfer_module, "kernel_for", lambda *a: "fa2")
    why = FlashInferBackend.supports(CUDA, BF16, "eager", 256, None, needs)
    assert why.startswith("attention backend 'flashinfer' does not serve sliding_window or "
                          "layer_shapes or chunk_kv") and "use 'sdpa'" in why
    with pytest.raises(OptionError, match="'flashinfer' does not serve sliding_window"):
        check_backend("flashinfer", CUDA, BF16, "eager", 256, None, needs)
    with pytest.raises(OptionError, match="decoder writes nothing to the cache"):
        check_backend("triton", CPU, F32, "eager", 256, KV_FP8, needs)
    check_backend("triton", CPU, F32, "eager", 256, None, needs)
    check_backend("sdpa", CPU, F32, "eager", 16, None, needs)
    assert default_backend(CUDA, BF16, "renoise", 256, None, needs) == "triton"
    assert default_backend(CUDA, BF16, "renoise", 256, KV_FP8, needs) == "sdpa"
    assert default_backend(CPU, F32, "renoise", 256, None, needs) == "sdpa"


def test_the_registry_asks_the_backend(monkeypatch):
    monkeypatch.setattr(TritonBackend, "supports", classmethod(lambda cls, *a: "its reason"))
    with pytest.raises(OptionError, match="^its reason$"):
        check_backend("triton", CPU, F32, "eager")
    monkeypatch.setattr(SDPABackend, "supports", classmethod(lambda cls, *a: None))
    check_backend("sdpa", CPU, F32, "device_loop")  # the backend's answer, nothing else


def test_decoders_name_their_reason():
    why = BlockDecoder.supports(LLADA)
    assert why.startswith("decoder 'block' does not fit a llada model") and "full" in why
    assert "block_causal" in CanvasDecoder.supports(SDAR)
    assert LookaheadDecoder.supports(LLADA) is None and BlockDecoder.supports(SDAR) is None
    with pytest.raises(OptionError, match=r"'canvas' does not fit a sdar .*use one of \['block'\]"):
        decoder_for(SDAR, "canvas", None)
    # what fits follows the family's attention, not a list of decoder names
    full = dataclasses.replace(SDAR, name="full-sdar", attention="full", default_decoder="canvas")
    assert decoder_for(full, "dllm_var", None)[0] == "dllm_var"
    with pytest.raises(OptionError, match=r"use one of \['canvas', 'dllm_var'\]"):
        decoder_for(full, "block", None)
    # a family whose own decoder is not built is refused by that decoder's name
    own = dataclasses.replace(SDAR, name="later", attention="other", default_decoder="later")
    with pytest.raises(OptionError, match=r"^later models need their own decoder, 'later', "
                                          r"which is not available yet; none of .* fits them$"):
        decoder_for(own, None, None)


def _sdar(**over):
    hf = preset("tiny-sdar")[0]
    hf.update(over)
    return sdar_config(hf, "sdar")


def test_persistent_round_names_what_it_does_not_serve():
    sdar = _sdar()
    assert PersistentRounds.supports(CUDA, 1, sdar, "block", BF16, BF16, "none") is None
    assert PersistentRounds.supports(CUDA, 1, sdar, "block", F32, F32, "fp8", "weight_only") \
        is None
    assert "needs a CUDA device" in PersistentRounds.supports(CPU)
    assert "tensor_parallel_size 2" in PersistentRounds.supports(CUDA, 2)
    llada = llada_config(preset("tiny-llada")[0], "llada")
    moe = sdar_config(preset("tiny-sdar-moe")[0], "sdar_moe")
    for config in (llada, moe):
        why = PersistentRounds.supports(CUDA, config=config)
        assert f"model family {config.family} (dense SDAR only" in why
    cases = [(dict(decoder="canvas"), "decoder canvas (block only)"),
             (dict(dtype=torch.float16), "dtype torch.float16"),
             (dict(quantization="nvfp4"), "quantization nvfp4"),
             (dict(quantization="fp8", fp8_activations="dynamic"),
              "fp8_activations='weight_only'"),
             (dict(dtype=BF16, kv_cache_dtype=KV_FP8), "KV cache torch.float8_e4m3fn")]
    for kw, words in cases:
        why = PersistentRounds.supports(CUDA, config=sdar, **kw)
        assert why.startswith("round_kernel 'persistent' does not serve: ") and words in why
    both = PersistentRounds.supports(CUDA, config=llada, decoder="canvas")
    assert "model family llada" in both and "decoder canvas" in both


class _FakeRounds:
    """Serves no forward (the layers do); records what it was built for."""

    built: list[int] = []
    asked: list[dict] = []
    answer: str | None = None

    @staticmethod
    def supports(**needs):
        _FakeRounds.asked.append(needs)
        return _FakeRounds.answer

    def __init__(self, model, cache, block):
        _FakeRounds.built.append(block)

    def forward(self, tokens, lens, chunk_block):
        return None


def test_the_engine_asks_the_persistent_round(tiny_sdar, tiny_llada, monkeypatch):
    monkeypatch.setattr(persistent_kernel, "PersistentRounds", _FakeRounds)
    monkeypatch.setattr(_FakeRounds, "built", [])
    monkeypatch.setattr(_FakeRounds, "asked", [])
    llm = LLM(tiny_sdar, device="cpu", round_kernel="persistent", max_model_len=64)
    *device_steps, checkpoint_step = _FakeRounds.asked  # before the folder opens, then after
    assert device_steps and all(a == dict(device=CPU, tensor_parallel_size=1)
                                for a in device_steps)
    assert checkpoint_step["config"] == llm.config and checkpoint_step["decoder"] == "block"
    assert (checkpoint_step["dtype"], checkpoint_step["kv_cache_dtype"]) == (F32, F32)
    assert checkpoint_step["quantization"] == "none"
    # built for a default request's block, given to the runner at construction
    assert isinstance(llm.runner.persistent, _FakeRounds)
    assert _FakeRounds.built == [llm.engine.resolved.block_length] == \
        [llm.resolve(DecodingOptions()).block_length]
    assert len(llm.generate([5, 6, 7], max_new_tokens=4).token_ids) == 4
    monkeypatch.setattr(_FakeRounds, "answer", "round_kernel 'persistent' does not serve: x")
    with pytest.raises(OptionError, match="does not serve: x"):
        Engine.open(EngineConfig.from_kwargs(model=str(tiny_llada), device="cpu",
                                             round_kernel="persistent"))


def test_round_weights_live_on_the_family_record(monkeypatch):
    names = family("sdar").round_weights
    assert family("llada").round_weights is None and family("sdar_moe").round_weights is None
    config = _sdar()
    with torch.device("meta"):
        model = SDARForCausalLM(config, get_ops("reference"))
    for layer in range(config.num_layers):  # every name is a weight of the built model
        for field in ("qkv", "o", "gate_up", "down", "input_norm", "post_norm", "q_norm",
                      "k_norm"):
            model.get_parameter(names.at(field, layer))
    for path in (names.embedding, names.lm_head, names.final_norm):
        model.get_parameter(path)
    assert hasattr(model.get_submodule(names.rotary), "cos_sin")
    plan = build_plan(config, 4, 3, 2)
    assert {t.weight for t in plan.tasks if t.kind == "o"} == \
        {names.at("o", i) for i in range(config.num_layers)}
    # a family's own names: the plan reads them from the record
    other = dataclasses.replace(names, o="model.layers.{layer}.self_attn.out.weight")
    monkeypatch.setattr(plan_module, "family",
                        lambda name: dataclasses.replace(SDAR, round_weights=other))
    assert {t.weight for t in build_plan(config, 4, 3, 2).tasks if t.kind == "o"} == \
        {f"model.layers.{i}.self_attn.out.weight" for i in range(config.num_layers)}
    monkeypatch.undo()
    with pytest.raises(ValueError, match="llada names none"):
        build_plan(llada_config(preset("tiny-llada")[0], "llada"), 4, 3, 2)
