"""ModelOpt NVFP4 checkpoints in the layouts NVIDIA publishes: `hf_quant_config.json` alone
(config.json without a quantization_config), with `input_scale` beside every quantised weight,
scalar or [1] global scales and the KV-cache scales of `kv_cache_quant_algo` "FP8"; the
config.json forms (`quant_method` "modelopt" with config_groups and kv_cache_scheme, ModelOpt's
object nested under "quantization", `quant_algo` in lower case, `quant_method`
"modelopt_fp4"); `exclude_modules` wildcards. Each loads to what make-checkpoint's NVFP4
checkpoint of the same weights holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.quant import read_scheme
from dlrt.errors import CheckpointError

PROMPT = [5, 17, 300, 4096, 77, 12, 9]

# hf_quant_config.json of an NVIDIA NVFP4 export, field for field
HF_QUANT = {"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                             "group_size": 16, "exclude_modules": ["lm_head"]}}
# config.json quantization_config of a newer NVIDIA NVFP4 export
CONFIG = {"config_groups": {"group_0": {
              "input_activations": {"dynamic": False, "num_bits": 4, "type": "float",
                                    "group_size": 16},
              "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
              "targets": ["Linear"]}},
          "ignore": ["lm_head"], "quant_algo": "NVFP4",
          "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
          "producer": {"name": "modelopt", "version": "0.37.0"}, "quant_method": "modelopt"}


@pytest.fixture(scope="module")
def nvfp4(tmp_path_factory) -> Path:
    return make_checkpoint("tiny-sdar-moe", tmp_path_factory.mktemp("nvfp4") / "ckpt",
                           quantization="nvfp4")


@pytest.fixture(scope="module")
def reference(nvfp4):
    llm = LLM(nvfp4)
    return dict(llm.engine.model.named_parameters()), llm.generate(PROMPT,
                                                                   max_new_tokens=8).token_ids


def _nvidia(src: Path, dst: Path, quant_config=None, hf_quant=None, scalar_shape=()) -> Path:
    """src rewritten as NVIDIA's exports are: global scales of `scalar_shape`, an input_scale
    beside every quantised weight, k/v scales on k_proj / v_proj; config.json's
    quantization_config `quant_config` (None: none) and hf_quant_config.json `hf_quant`
    (None: none)."""
    shutil.copytree(src, dst)
    t = load_file(src / "model.safetensors")
    for key in [k for k in t if k.endswith(".weight_scale_2")]:
        t[key] = t[key].reshape(scalar_shape)
        t[key.replace(".weight_scale_2", ".input_scale")] = torch.tensor(0.01).reshape(
            scalar_shape)
    for i in range(2):
        for kv in "kv":
            t[f"model.layers.{i}.self_attn.{kv}_proj.{kv}_scale"] = torch.tensor(0.5 + i)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("quantization_config")
    if quant_config is not None:
        cfg["quantization_config"] = quant_config
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "hf_quant_config.json").unlink()
    if hf_quant is not None:
        (dst / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return dst


def _same(path: Path, reference) -> LLM:
    params, tokens = reference
    llm = LLM(path)
    assert llm.engine_config.quantization == "nvfp4"
    held = dict(llm.engine.model.named_parameters())
    assert held.keys() == params.keys()
    for name, value in held.items():
        a, b = value, params[name]
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b), name
    assert llm.generate(PROMPT, max_new_tokens=8).token_ids == tokens
    return llm


@pytest.mark.parametrize("scalar_shape", [(), (1,)])
def test_hf_quant_config_alone(nvfp4, reference, tmp_path, scalar_shape):
    """hf_quant_config.json in NVIDIA's shape and no quantization_config in config.json: the
    same weights as make-checkpoint's; input_scale is not read; kv_cache_dtype='fp8' reads
    the k_proj / v_proj scales."""
    path = _nvidia(nvfp4, tmp_path / "hf", hf_quant=HF_QUANT, scalar_shape=scalar_shape)
    _same(path, reference)
    fp8_cache = LLM(path, kv_cache_dtype="fp8")
    assert fp8_cache.kv_cache.k_scale.tolist() == [0.5, 1.5]
    assert len(fp8_cache.generate(PROMPT, max_new_tokens=4).token_ids) == 4


def _nested(q):
    return {"quant_method": "modelopt", "producer": HF_QUANT["producer"],
            "quantization": dict(HF_QUANT["quantization"])}


@pytest.mark.parametrize("form", [
    lambda: dict(CONFIG),  # NVIDIA's config.json form
    lambda: _nested(None),  # ModelOpt's object nested in config.json
    lambda: {**CONFIG, "quant_algo": "nvfp4"},  # the algorithm in lower case
    lambda: {**CONFIG, "quant_method": "modelopt_fp4"},
], ids=["config_groups", "nested", "lower_case", "modelopt_fp4"])
def test_config_json_forms(nvfp4, reference, tmp_path, form):
    """config.json alone (no hf_quant_config.json) in each form ModelOpt and vLLM read."""
    q = form()
    scheme = read_scheme({"quantization_config": q}, tmp_path)
    assert scheme.name == "nvfp4" and scheme.not_convert == ("lm_head",)
    _same(_nvidia(nvfp4, tmp_path / "cfg", quant_config=q), reference)


def test_nested_settings_are_checked(tmp_path):
    q = _nested(None)
    q["quantization"]["group_size"] = 32
    with pytest.raises(CheckpointError, match="NVFP4 group_size 32 is not supported"):
        read_scheme({"quantization_config": q}, tmp_path)


def test_exclude_modules_wildcard(tmp_path_factory, tmp_path):
    """ModelOpt's "<module path>*" entries leave the whole subtree unquantised."""
    src = make_checkpoint("tiny-sdar", tmp_path_factory.mktemp("plain") / "ckpt")
    quant = make_checkpoint("tiny-sdar", tmp_path / "q", quantization="nvfp4")
    ref = load_file(src / "model.safetensors")
    t = load_file(quant / "model.safetensors")
    mlp = "model.layers.1.mlp"
    for key in [k for k in t if k.startswith(mlp)]:
        del t[key]
    t.update({k: v for k, v in ref.items() if k.startswith(mlp)})
    save_file(t, str(quant / "model.safetensors"), metadata={"format": "pt"})
    hf = {**HF_QUANT, "quantization": {**HF_QUANT["quantization"],
                                       "exclude_modules": ["lm_head", f"{mlp}*"]}}
    (quant / "hf_quant_config.json").write_text(json.dumps(hf))
    llm = LLM(quant)
    quantised = {n for n, m in llm.engine.model.named_modules()
                 if getattr(m, "quant_format", None) is not None}
    assert f"{mlp}.gate_up_proj" not in quantised and f"{mlp}.down_proj" not in quantised
    assert "model.layers.0.mlp.gate_up_proj" in quantised
    assert len(llm.generate(PROMPT, max_new_tokens=4).token_ids) == 4
