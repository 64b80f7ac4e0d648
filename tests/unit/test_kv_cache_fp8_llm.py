"""`kv_cache_dtype="fp8"` end to end on the CPU: tiny checkpoints generate with an FP8 cache,
their logits stay close to the fp32 cache's (relative L2 < 5e-2: e4m3 keeps 3 mantissa bits),
the Triton ops and backend (interpreter) store and read what the reference ops and SDPA do,
per-layer k_scale / v_scale are read from the checkpoint (both naming conventions), and bad
combinations fail with named errors before anything loads."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dlrt import LLM
from dlrt.attention.registry import default_backend
from dlrt.entrypoints.cli import build_parser, engine_kwargs
from dlrt.entrypoints.cli import main as cli_main
from dlrt.errors import CheckpointError, OptionError
from dlrt.ops.reference import KV_FP8, quantize_kv

B = 4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _prefill_and_block(llm: LLM, chunk_block: int | None) -> torch.Tensor:
    """Logits of a 7-token chunk at 20 over a cached 20-token prefix."""
    ids = torch.randint(0, llm.config.vocab_size, (27,), generator=torch.Generator().manual_seed(0))
    llm.runner.forward_at(ids[:20], 0, chunk_block)
    return llm.runner.forward_at(ids[20:], 20, chunk_block)


@pytest.mark.parametrize("preset,chunk_block", [("tiny_sdar", B), ("tiny_llada2", B),
                                                ("tiny_llada", None)])
def test_fp8_cache_generates_close_to_the_fp32_cache(request, preset, chunk_block):
    path = request.getfixturevalue(preset)
    plain = LLM(path, max_model_len=128)
    fp8 = LLM(path, max_model_len=128, kv_cache_dtype="fp8")
    assert fp8.engine_config.kv_cache_dtype == "fp8" and fp8.kv_cache.k.dtype == KV_FP8
    assert plain.engine_config.kv_cache_dtype == "float32"
    assert plain.kv_cache.k.dtype == torch.float32
    assert fp8.kv_cache.nbytes * 4 == plain.kv_cache.nbytes
    ref, got = _prefill_and_block(plain, chunk_block), _prefill_and_block(fp8, chunk_block)
    assert 1e-4 < _rel(got, ref) < 5e-2  # quantised, and close
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8
    # the cached keys are the fp32 cache's within half an e4m3 step (scale 1: |k| >= 2^-6)
    k, _ = fp8.kv_cache.read(0, 27)
    k_ref, _ = plain.kv_cache.read(0, 27)
    normal = k_ref.abs() >= 2**-6
    assert ((k - k_ref).abs() <= 2**-4 * k_ref.abs() * (1 + 2**-16))[normal].all()
    prompt = list(range(100, 113))
    out = fp8.generate(prompt, max_new_tokens=12, temperature=0, ignore_eos=True)
    assert len(out.token_ids) == 12


def test_triton_ops_and_backend_match_the_reference_on_fp8(tiny_sdar):
    """Interpreter: the fused write kernel stores the reference's bytes, the Triton attention
    reads them as SDPA does (fp32: relative error < 1e-5), greedy tokens are identical."""
    pytest.importorskip("triton")
    kw = dict(max_model_len=128, kv_cache_dtype="fp8", dtype="float32", device="cpu")
    ref = LLM(tiny_sdar, **kw)
    tri = LLM(tiny_sdar, kernels="triton", attention_backend="triton", **kw)
    for llm in (ref, tri):  # sharper distributions: greedy choices are far from ties
        llm.model.lm_head.weight.data *= 50
    logits = [_prefill_and_block(llm, B) for llm in (ref, tri)]
    assert _rel(logits[1], logits[0]) < 1e-5
    for name in ("k", "v"):
        a, b = (getattr(llm.kv_cache, name)[:, :2].view(torch.uint8) for llm in (ref, tri))
        assert torch.equal(a, b), name
    prompt = list(range(2000, 2011))
    res = [llm.generate(prompt, max_new_tokens=9, temperature=0, threshold=0.3)
           for llm in (ref, tri)]
    assert res[1].token_ids == res[0].token_ids
    assert res[1].denoise_steps == res[0].denoise_steps


def _with_scales(src: Path, dst: Path, scales: dict[str, float]) -> Path:
    """A copy of checkpoint `src` with extra scalar tensors in their own shard (indexed)."""
    shutil.copytree(src, dst)
    save_file({k: torch.tensor(v) for k, v in scales.items()}, dst / "kv-scales.safetensors")
    weights = {}
    for shard in sorted(dst.glob("model*.safetensors")):
        from safetensors import safe_open

        with safe_open(shard, framework="pt") as f:
            weights |= dict.fromkeys(f.keys(), shard.name)
    weights |= dict.fromkeys(scales, "kv-scales.safetensors")
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weights}))
    return dst


NAMINGS = {"attention": ("model.layers.{i}.self_attn.k_scale",
                         "model.layers.{i}.self_attn.v_scale"),
           "projections": ("model.layers.{i}.self_attn.k_proj.k_scale",
                           "model.layers.{i}.self_attn.v_proj.v_scale")}


@pytest.mark.parametrize("naming", sorted(NAMINGS))
def test_checkpoint_scales_are_used(tiny_sdar, tmp_path, naming, caplog):
    k_name, v_name = NAMINGS[naming]
    layers = LLM(tiny_sdar, max_model_len=64).config.num_layers
    scales = {k_name.format(i=i): 2.0 for i in range(layers)}
    scales |= {v_name.format(i=i): 0.5 + i for i in range(layers)}
    path = _with_scales(tiny_sdar, tmp_path / "ckpt", scales)
    with caplog.at_level(logging.WARNING, logger="dlrt"):
        fp8 = LLM(path, max_model_len=64, kv_cache_dtype="fp8")
        plain = LLM(path, max_model_len=64)  # the scales serve only an FP8 cache
    assert not [r for r in caplog.records if "ignored" in r.message]
    assert fp8.kv_cache.k_scale.tolist() == [2.0] * layers
    assert fp8.kv_cache.v_scale.tolist() == [0.5 + i for i in range(layers)]
    unit = LLM(tiny_sdar, max_model_len=64, kv_cache_dtype="fp8")
    assert unit.kv_cache.k_scale.tolist() == [1.0] * layers
    for llm in (fp8, plain, unit):
        _prefill_and_block(llm, B)
    # layer 0's K/V do not depend on attention: the stored bytes are the fp32 cache's divided
    # by the checkpoint's scales, and read back multiplied by them
    n = 27
    k_ref, v_ref = plain.kv_cache.read(0, n)
    slots = fp8.kv_cache.slots(torch.arange(n))
    stored_k = fp8.kv_cache.k[0].view(-1, *k_ref.shape[1:])[slots]
    stored_v = fp8.kv_cache.v[0].view(-1, *v_ref.shape[1:])[slots]
    assert torch.equal(stored_k.view(torch.uint8),
                       quantize_kv(k_ref, torch.tensor(2.0)).view(torch.uint8))
    assert torch.equal(stored_v.view(torch.uint8),
                       quantize_kv(v_ref, torch.tensor(0.5)).view(torch.uint8))
    assert not torch.equal(stored_v.view(torch.uint8),
                           unit.kv_cache.v[0].view(-1, *v_ref.shape[1:])[slots].view(torch.uint8))
    k, v = fp8.kv_cache.read(0, n)
    torch.testing.assert_close(k, stored_k.float() * 2.0)
    torch.testing.assert_close(v, stored_v.float() * 0.5)


@pytest.mark.parametrize("scales,message", [
    ({"model.layers.0.self_attn.k_scale": 2.0}, "lacks"),  # only one layer, only K
    ({"model.layers.{i}.self_attn.k_scale": -1.0, "model.layers.{i}.self_attn.v_scale": 1.0},
     "positive"),
])
def test_checkpoint_scale_errors(tiny_sdar, tmp_path, scales, message):
    layers = LLM(tiny_sdar, max_model_len=64).config.num_layers
    scales = {k.format(i=i): v for k, v in scales.items() for i in range(layers)}
    path = _with_scales(tiny_sdar, tmp_path / "ckpt", scales)
    with pytest.raises(CheckpointError, match=message):
        LLM(path, max_model_len=64, kv_cache_dtype="fp8")


def test_non_scalar_scale_is_refused(tiny_sdar, tmp_path):
    path = _with_scales(tiny_sdar, tmp_path / "ckpt", {})
    layers = LLM(tiny_sdar, max_model_len=64).config.num_layers
    tensors = {f"model.layers.{i}.self_attn.{s}": torch.ones(2)
               for i in range(layers) for s in ("k_scale", "v_scale")}
    save_file(tensors, path / "kv-scales.safetensors")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"] |= dict.fromkeys(tensors, "kv-scales.safetensors")
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"scalar \(\[\] or \[1\]\)"):
        LLM(path, max_model_len=64, kv_cache_dtype="fp8")


def test_bad_value_and_flashinfer_are_named_errors(tiny_sdar, monkeypatch):
    with pytest.raises(OptionError, match="kv_cache_dtype 'int8': unknown kv cache dtype"):
        LLM(tiny_sdar, kv_cache_dtype="int8")
    for backend in ("flashinfer", "flashinfer-fa2"):
        with pytest.raises(OptionError, match="attention_backend='triton'") as e:
            LLM(tiny_sdar, attention_backend=backend, kv_cache_dtype="fp8")
        assert "FP8 KV cache" in str(e.value)
    monkeypatch.setenv("DLRT_ATTENTION_BACKEND", "flashinfer")
    with pytest.raises(OptionError, match="DLRT_ATTENTION_BACKEND=flashinfer"):
        LLM(tiny_sdar, kv_cache_dtype="fp8")


def test_auto_backend_reads_an_fp8_cache():
    """On CUDA `auto` never picks FlashInfer for an FP8 cache (not even for a canvas, which
    would take it on Hopper); on the CPU it is SDPA."""
    cuda = torch.device("cuda")
    for decoder in ("block", "canvas", "dllm_var"):
        assert default_backend(cuda, torch.bfloat16, decoder, 128, KV_FP8) == "triton"
    assert default_backend(torch.device("cpu"), torch.float32, "canvas", 128, KV_FP8) == "sdpa"


def test_cli_flag(tiny_sdar, capsys):
    parser = build_parser()
    for command in (["generate", "--prompt", "x"], ["serve"], ["bench", "step"]):
        args = parser.parse_args([*command, "--kv-cache-dtype", "fp8"])
        assert engine_kwargs(args)["kv_cache_dtype"] == "fp8"
    assert engine_kwargs(parser.parse_args(["serve"]))["kv_cache_dtype"] == "auto"
    with pytest.raises(SystemExit) as e:
        cli_main(["generate", "--prompt", "x", "--kv-cache-dtype", "int8"])
    assert e.value.code == 2 and "--kv-cache-dtype" in capsys.readouterr().err
    assert cli_main(["generate", "--model", str(tiny_sdar), "--prompt-ids", "1,2,3", "--json",
                     "--kv-cache-dtype", "fp8", "--max-new-tokens", "4",
                     "--max-model-len", "64"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(out["token_ids"]) == 4
