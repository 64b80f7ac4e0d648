"""Quantised checkpoints on the CPU: the files make-checkpoint writes (FP8 in the Hugging Face
block layout, NVFP4 in ModelOpt's, compressed-tensors FP8 per channel:
test_quant_compressed_tensors.py), what a load holds, online quantisation bit-identical to
the written checkpoints, generation, logits against the unquantised model, and the named
errors."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import PRESETS
from dlrt.engine.config import EngineConfig
from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.quant.fp8 import quantize_fp8_block
from dlrt.layers.quant.nvfp4 import quantize_nvfp4

IDS = [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198]
PROMPT = [5, 17, 300, 4096, 77, 12, 9]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(source, quantization) -> a bf16 checkpoint written once (seed 0)."""
    cache: dict = {}

    def get(source, quantization: str = "none") -> Path:
        key = (str(source), quantization)
        if key not in cache:
            out = tmp_path_factory.mktemp("quant") / "ckpt"
            cache[key] = make_checkpoint(source, out, quantization=quantization)
        return cache[key]
    return get


@pytest.fixture(scope="module")
def aligned(tmp_path_factory) -> Path:
    """A tiny SDAR-MoE config whose projections and experts are multiples of 128 rows: FP8
    scales held in block rows (the layout of real models)."""
    cfg = copy.deepcopy(PRESETS["tiny-sdar-moe"])
    cfg.update(hidden_size=128, num_attention_heads=8, num_key_value_heads=8, head_dim=16,
               moe_intermediate_size=128, num_experts=4)
    path = tmp_path_factory.mktemp("aligned")
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _params(llm: LLM) -> dict[str, torch.Tensor]:
    return dict(llm.engine.model.named_parameters())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _quantised(llm: LLM) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in llm.engine.model.named_modules()
            if getattr(m, "quant_format", None) is not None}


def _tokens(llm: LLM) -> list[int]:
    return llm.generate(PROMPT, max_new_tokens=8).token_ids


# quantised modules: per layer qkv, o and the MLP's gate-up and down (dense) or the experts
# (MoE; LLaDA2 also the shared expert's two); LLaDA2's layer 0 is dense
QUANTISED = {"tiny-sdar": 2 * 4, "tiny-sdar-moe": 2 * 3, "aligned": 2 * 3, "tiny-llada": 2 * 4,
             "tiny-llada2": 4 + 2 * 5}
CT = "compressed-tensors-fp8"
CASES = [("tiny-sdar", "fp8"), ("tiny-sdar-moe", "fp8"), ("tiny-llada2", "fp8"),
         ("tiny-llada", "fp8"), ("aligned", "fp8"), ("tiny-sdar-moe", "nvfp4"),
         ("tiny-llada2", "nvfp4"), ("tiny-sdar", CT), ("tiny-sdar-moe", CT), ("tiny-llada", CT),
         ("tiny-llada2", CT)]


@pytest.mark.parametrize("source,quantization", CASES)
def test_online_equals_offline(made, aligned, source, quantization):
    """LLM(bf16 folder, quantization=q) holds bit for bit what LLM(make-checkpoint
    --quantization q of the same seed) holds, and generates the same greedy tokens."""
    src = aligned if source == "aligned" else source
    offline = LLM(made(src, quantization))
    online = LLM(made(src), quantization=quantization)
    assert offline.engine_config.quantization == online.engine_config.quantization \
        == quantization
    a, b = _params(offline), _params(online)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(_bits(a[name]), _bits(b[name])), name
    quantised = _quantised(offline)
    head = "model.transformer.ff_out" if source == "tiny-llada" else "lm_head"
    assert quantised and head not in quantised
    assert len(quantised) == QUANTISED[source], sorted(quantised)
    assert _tokens(offline) == _tokens(online)


def test_dummy_weights_equal_the_written_checkpoint(made):
    """load_format='dummy' with quantization='fp8' draws and quantises what make-checkpoint
    writes (bf16 model: the values are drawn in the same dtype)."""
    dummy = LLM(made("tiny-sdar-moe"), load_format="dummy", quantization="fp8",
                dtype="bfloat16")
    files = LLM(made("tiny-sdar-moe", "fp8"), dtype="bfloat16")
    a, b = _params(dummy), _params(files)
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)


def test_fp8_files(made):
    """FP8: e4m3 weights and fp32 [ceil(out/128), ceil(in/128)] scales for the projections and
    every expert, quantised from the same-seed bf16 weights; embeddings, norms, router and the
    LM head in bf16 without scales; the Hugging Face quantization_config."""
    path = made("tiny-sdar-moe", "fp8")
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert cfg == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                   "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
    q = load_file(path / "model.safetensors")
    ref = load_file(made("tiny-sdar-moe") / "model.safetensors")
    scales = [k for k in q if k.endswith(".weight_scale_inv")]
    assert len(scales) == 2 * (4 + 8 * 3)  # per layer: q, k, v, o and 8 experts x 3
    for key in scales:
        w = key.removesuffix("_scale_inv")
        expect_w, expect_s = quantize_fp8_block(ref[w])
        assert q[w].dtype == torch.float8_e4m3fn and q[key].dtype == torch.float32
        assert q[key].shape == (-(-ref[w].shape[0] // 128), -(-ref[w].shape[1] // 128))
        assert torch.equal(_bits(q[w]), _bits(expect_w)) and torch.equal(q[key], expect_s)
    for key in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight",
                "model.layers.0.mlp.gate.weight", "model.layers.1.self_attn.q_norm.weight"):
        assert q[key].dtype == torch.bfloat16 and torch.equal(q[key], ref[key])
        assert key.replace(".weight", ".weight_scale_inv") not in q
    assert set(q) == set(ref) | set(scales)


def test_nvfp4_files(made):
    """NVFP4: uint8 [out, in/2] (two e2m1 per byte, low nibble first), e4m3 [out, in/16] group
    scales, an fp32 scalar global scale per tensor; hf_quant_config.json and config.json's
    ModelOpt quantization_config."""
    path = made("tiny-sdar-moe", "nvfp4")
    hf_quant = json.loads((path / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == "NVFP4" and hf_quant["group_size"] == 16
    assert hf_quant["exclude_modules"] == ["lm_head"]
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "modelopt" and cfg["quant_algo"] == "NVFP4"
    q = load_file(path / "model.safetensors")
    ref = load_file(made("tiny-sdar-moe") / "model.safetensors")
    globals_ = [k for k in q if k.endswith(".weight_scale_2")]
    assert len(globals_) == 2 * (4 + 8 * 3)
    for key in globals_:
        w = key.removesuffix("_scale_2")
        ew, es, eg = quantize_nvfp4(ref[w])
        n, k = ref[w].shape
        assert q[w].dtype == torch.uint8 and q[w].shape == (n, k // 2)
        assert q[w + "_scale"].dtype == torch.float8_e4m3fn and q[w + "_scale"].shape == \
            (n, k // 16)
        assert q[key].dtype == torch.float32 and q[key].shape == ()
        assert torch.equal(q[w], ew) and torch.equal(_bits(q[w + "_scale"]), _bits(es))
        assert torch.equal(q[key], eg)
    assert q["lm_head.weight"].dtype == torch.bfloat16


def test_held_tensors_are_the_files(made, aligned):
    """The loaded parts are the files' tensors: merged q/k/v rows concatenated, scale rows
    repeated per weight row (parts of 64/32 rows) or concatenated as stored (128-row parts)."""
    for src, rows in (("tiny-sdar", False), (aligned, True)):
        path = made(src, "fp8")
        t = load_file(path / "model.safetensors")
        layer = _params(LLM(path))
        p = "model.layers.1.self_attn"
        parts = [f"{p}.{n}_proj" for n in "qkv"]
        w = torch.cat([t[f"{x}.weight"] for x in parts])
        assert torch.equal(_bits(layer[f"{p}.qkv_proj.weight"]), _bits(w))
        s = [t[f"{x}.weight_scale_inv"] for x in parts]
        if not rows:
            s = [x.repeat_interleave(128, 0)[:t[f"{n}.weight"].shape[0]]
                 for x, n in zip(s, parts, strict=True)]
        assert torch.equal(layer[f"{p}.qkv_proj.weight_scale_inv"], torch.cat(s))
        o = f"{p}.o_proj.weight_scale_inv"
        assert torch.equal(layer[o], t[o])
    t = load_file(made("tiny-sdar-moe", "nvfp4") / "model.safetensors")
    held = _params(LLM(made("tiny-sdar-moe", "nvfp4")))
    e = "model.layers.0.mlp.experts"
    g = torch.cat([t[f"{e}.3.gate_proj.weight_scale_2"].expand(32),
                   t[f"{e}.3.up_proj.weight_scale_2"].expand(32)])
    assert torch.equal(held[f"{e}.w13_weight_scale_2"][3], g)
    assert torch.equal(held[f"{e}.w2"][5], t[f"{e}.5.down_proj.weight"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _dequantised_copy(quantised: LLM, plain: LLM) -> None:
    """Set the unquantised model's weights to the quantised model's dequantised weights."""
    modules = dict(plain.engine.model.named_modules())
    for name, m in _quantised(quantised).items():
        for weight, k in m.quant_cols.items():
            held = {s: getattr(m, p) for p, (w, s) in m.quant_params.items() if w == weight}
            getattr(modules[name], weight).data.copy_(
                m.quant_format.dequantize(held, k, torch.float32))


# relative L2 error of the logits against the unquantised fp32 model: about twice what tiny
# random SDAR / SDAR-MoE models measure (0.033-0.036 for FP8, 0.120-0.126 for NVFP4,
# 0.036-0.037 for compressed-tensors FP8; with dynamic activations FP8 0.045-0.046 and
# compressed-tensors FP8 0.046-0.050)
BOUND = {"fp8": 0.07, "nvfp4": 0.25, CT: 0.07}


@pytest.mark.parametrize("quantization", ["fp8", "nvfp4", CT])
@pytest.mark.parametrize("n", [8, 21])
def test_logits_against_the_unquantised_model(made, quantization, n):
    """Weight-only: equal (up to matmul order: here bit-equal) to the fp32 model on the
    dequantised weights; within BOUND of the unquantised model. FP8 with dynamic activations
    (the default) adds the activations' quantisation error, within the same bound. n=8:
    gathered experts, n=21: the loop."""
    quant = LLM(made("tiny-sdar-moe", quantization), fp8_activations="weight_only")
    plain = LLM(made("tiny-sdar-moe"))
    ids = torch.tensor((IDS * 2)[:n])
    base = plain.runner.forward_at(ids, 0, chunk_block=4).clone()
    _dequantised_copy(quant, plain)
    ours = quant.runner.forward_at(ids, 0, chunk_block=4)
    assert _rel(ours, plain.runner.forward_at(ids, 0, chunk_block=4)) < 1e-6
    err = _rel(ours, base)
    assert 1e-4 < err < BOUND[quantization]
    if quantization != "nvfp4":
        dynamic = LLM(made("tiny-sdar-moe", quantization)).runner.forward_at(ids, 0,
                                                                              chunk_block=4)
        assert 1e-4 < _rel(dynamic, ours) and _rel(dynamic, base) < BOUND[quantization]


def _rewrite(src: Path, dst: Path, drop=(), put=None, config=None) -> Path:
    """A copy of a single-file checkpoint with tensors dropped / replaced and config changes."""
    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    for k in drop:
        del tensors[k]
    tensors.update(put or {})
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


O_PROJ = "model.layers.0.self_attn.o_proj"


def _set_q(**kw):
    return lambda cfg: cfg["quantization_config"].update(kw)


@pytest.mark.parametrize("change,error", [
    (dict(drop=[f"{O_PROJ}.weight_scale_inv"]),
     rf"{O_PROJ}.weight_scale_inv'\]; quantised layers lack their scales"),
    (dict(put={f"{O_PROJ}.weight_scale_inv": torch.ones(2, 3)}),
     r"weight_scale_inv .*shape \[2, 3\]"),
    (dict(put={f"{O_PROJ}.weight": torch.zeros(64, 64, dtype=torch.bfloat16)}), "float8_e4m3fn"),
    (dict(config=_set_q(quant_method="awq")), "quant_method 'awq' is not supported"),
    (dict(config=_set_q(weight_block_size=[64, 64])), "weight_block_size"),
    (dict(config=_set_q(modules_to_not_convert=["model.layers.0.self_attn.q_proj"])),
     "some parts of model.layers.0.self_attn.qkv_proj"),
])
def test_fp8_checkpoint_errors(made, tmp_path, change, error):
    path = _rewrite(made("tiny-sdar", "fp8"), tmp_path / "bad", **change)
    with pytest.raises(CheckpointError, match=error):
        LLM(path)


def test_nvfp4_without_global_scale(made, tmp_path):
    path = _rewrite(made("tiny-sdar", "nvfp4"), tmp_path / "bad",
                    drop=[f"{O_PROJ}.weight_scale_2"])
    with pytest.raises(CheckpointError, match=f"{O_PROJ}.weight_scale_2"):
        LLM(path)


def test_option_errors(made):
    with pytest.raises(OptionError, match=r"quantization 'int4'.*'fp8'"):
        EngineConfig.from_kwargs(quantization="int4")
    with pytest.raises(OptionError, match=r"quantization 'int4'.*'nvfp4'"):
        make_checkpoint("tiny-sdar", "/nonexistent/never", quantization="int4")
    with pytest.raises(OptionError, match="quantization='auto' or 'fp8'"):
        LLM(made("tiny-sdar", "fp8"), quantization="none")
    with pytest.raises(OptionError, match="does not match"):
        LLM(made("tiny-sdar", "fp8"), quantization="nvfp4")


def test_modules_to_not_convert(made, tmp_path):
    """Modules the config lists stay unquantised (their bf16 tensors, no scales); the rest
    are FP8; it generates."""
    mlp = "model.layers.1.mlp"
    ref = load_file(made("tiny-sdar") / "model.safetensors")
    parts = [f"{mlp}.{p}_proj" for p in ("gate", "up", "down")]
    path = _rewrite(made("tiny-sdar", "fp8"), tmp_path / "skip",
                    drop=[f"{p}.weight_scale_inv" for p in parts],
                    put={f"{p}.weight": ref[f"{p}.weight"] for p in parts},
                    config=lambda c: c["quantization_config"]["modules_to_not_convert"]
                    .append(mlp))
    llm = LLM(path)
    quantised = _quantised(llm)
    assert f"{mlp}.gate_up_proj" not in quantised and f"{mlp}.down_proj" not in quantised
    assert "model.layers.0.mlp.gate_up_proj" in quantised
    assert _params(llm)[f"{mlp}.down_proj.weight"].dtype == torch.float32
    assert len(_tokens(llm)) == 8


def test_head_quantised_when_the_checkpoint_holds_its_scale(made, tmp_path):
    ref = load_file(made("tiny-sdar") / "model.safetensors")
    w, s = quantize_fp8_block(ref["lm_head.weight"])
    path = _rewrite(made("tiny-sdar", "fp8"), tmp_path / "head",
                    put={"lm_head.weight": w, "lm_head.weight_scale_inv": s},
                    config=_set_q(modules_to_not_convert=[]))
    llm = LLM(path)
    assert "lm_head" in _quantised(llm) and llm.engine.model.lm_head.method.name == "fp8"


def test_cli_flags(made, tmp_path):
    from dlrt.entrypoints.cli import build_parser, engine_kwargs, main

    out = tmp_path / "cli"
    assert main(["make-checkpoint", "tiny-sdar", str(out), "--quantization", "fp8"]) == 0
    with safe_open(out / "model.safetensors", "pt") as f, \
            safe_open(made("tiny-sdar", "fp8") / "model.safetensors", "pt") as g:
        assert set(f.keys()) == set(g.keys())
        assert all(torch.equal(_bits(f.get_tensor(k)), _bits(g.get_tensor(k)))
                   for k in f.keys())
    args = build_parser().parse_args(["generate", "--prompt", "x", "--quantization", "fp8"])
    assert engine_kwargs(args)["quantization"] == "fp8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--quantization", "int4"])


@pytest.mark.parametrize("quantization", ["fp8", CT])
def test_triton_kernels_in_the_interpreter(made, quantization):
    """kernels='triton' on the CPU (TRITON_INTERPRET=1): FP8 projections take the reference
    path (their inputs quantised by the Triton RMSNorm / SiLU-and-mul), the Triton MoE reads
    or dequantises the experts; the tokens are the reference kernels'."""
    path = made("tiny-sdar-moe", quantization)
    assert LLM(path, kernels="triton").generate(PROMPT, max_new_tokens=4).token_ids == \
        LLM(path).generate(PROMPT, max_new_tokens=4).token_ids
