"""compressed-tensors FP8 checkpoints on the CPU: the files make-checkpoint writes (per-channel
e4m3, the config of the hub's FP8-dynamic checkpoints), the quantisation and the linear method
against plain references written here, a checkpoint in the exact shape of the hub's (bf16
scales, every field of its config), per-tensor scales with static input scales, a weight-only
checkpoint, `ignore` regexes, every family's logits against its unquantised model, and the
named errors for the schemes dlrt does not run. (Every family's checkpoint loads, generates and
holds what its online quantisation holds: test_quant_checkpoint.py.)"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.quant import read_scheme
from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.linear import Linear, MergedLinear
from dlrt.layers.quant.compressed_tensors import (
    CT_FP8_FORMAT,
    CtFp8Linear,
    quantize_fp8_channel,
)
from dlrt.layers.quant.convert import quantize_module
from dlrt.ops import Fp8Activation

CT = "compressed-tensors-fp8"
PROMPT = [5, 17, 300, 4096, 77, 12, 9]
IDS = [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198]

# config.json `quantization_config` of a hub FP8-dynamic checkpoint, field for field
HUB = {
    "config_groups": {"group_0": {
        "input_activations": {"actorder": None, "block_structure": None, "dynamic": True,
                              "group_size": None, "num_bits": 8, "observer": None,
                              "observer_kwargs": {}, "strategy": "token", "symmetric": True,
                              "type": "float"},
        "output_activations": None,
        "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                    "group_size": None, "num_bits": 8, "observer": "minmax",
                    "observer_kwargs": {}, "strategy": "channel", "symmetric": True,
                    "type": "float"}}},
    "format": "float-quantized",
    "global_compression_ratio": 1.4583,
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "sparsity_config": {},
    "transform_config": {},
    "version": "0.10.2",
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(source, quantization) -> a bf16 checkpoint written once (seed 0)."""
    cache: dict = {}

    def get(source, quantization: str = "none") -> Path:
        key = (str(source), quantization)
        if key not in cache:
            out = tmp_path_factory.mktemp("ct") / "ckpt"
            cache[key] = make_checkpoint(source, out, quantization=quantization)
        return cache[key]
    return get


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _params(llm: LLM) -> dict[str, torch.Tensor]:
    return dict(llm.engine.model.named_parameters())


def _quantised(llm: LLM) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in llm.engine.model.named_modules()
            if getattr(m, "quant_format", None) is not None}


def _rewrite(src: Path, dst: Path, tensors=None, config=None) -> Path:
    """A copy of a single-file checkpoint: tensors = f(dict) edits them, config = f(q) its
    quantization_config (returning the new one)."""
    shutil.copytree(src, dst)
    t = load_file(src / "model.safetensors")
    if tensors is not None:
        tensors(t)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = config(cfg["quantization_config"])
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _logits_error(path: Path, plain: Path, ids=IDS, **kw) -> float:
    ids = torch.tensor(ids)
    base = LLM(plain).runner.forward_at(ids, 0, chunk_block=4)
    return _rel(LLM(path, **kw).runner.forward_at(ids, 0, chunk_block=4), base)


# -- the quantisation and the linear method --------------------------------------------------

def test_channel_quantisation_matches_reference():
    """Row by row: scale = amax / 448 (1 for an all-zero row), codes e4m3(clamp(w / scale));
    the dequantised weight is codes * scale, within e4m3's rounding of w."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(37, 300, generator=g) * torch.rand(37, 1, generator=g)).to(torch.bfloat16)
    w[5] = 0
    q, s = quantize_fp8_channel(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (37, 300)
    assert s.dtype == torch.float32 and s.shape == (37, 1)
    for i in range(37):
        row = w[i].float()
        amax = row.abs().max()
        scale = amax / 448.0 if amax > 0 else torch.tensor(1.0)
        assert s[i, 0] == scale
        want = (row / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(_bits(q[i]), _bits(want))
    deq = CT_FP8_FORMAT.dequantize({"weight": q, "weight_scale": s}, 300, torch.float32)
    assert torch.equal(deq, q.float() * s)
    err = (deq - w.float()).abs()
    assert torch.all(err <= w.float().abs() * 2**-4 + s * 2**-10 * (1 + 1e-6))


def _layer(w: torch.Tensor, parts: dict[str, int] | None = None):
    """A linear layer holding w quantised per part as a checkpoint stores it."""
    n, k = w.shape
    with torch.device("meta"):
        layer = MergedLinear(k, parts) if parts else Linear(k, n)
    quantize_module(layer, CT_FP8_FORMAT)
    sizes = list(parts.values()) if parts else [n]
    held = [quantize_fp8_channel(p) for p in w.split(sizes)]
    layer.weight = torch.nn.Parameter(torch.cat([q for q, _ in held]), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(torch.cat([s for _, s in held]),
                                            requires_grad=False)
    return layer, held


@pytest.mark.parametrize("parts", [None, {"q": 40, "k": 24, "v": 24}])
@pytest.mark.parametrize("rows", [1, 3])
def test_linear_method_against_direct_dequantisation(parts, rows):
    """Weight-only: exactly F.linear with codes * scale (each part's own row scales, merged
    parts concatenated); dynamic: x first quantised per token and 128-column group as a value;
    an input quantised by its producer (an Fp8Activation) gives the same output."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(88, 200, generator=g) * 0.05
    w[40:64] *= 30  # k_proj's rows: another scale range
    layer, held = _layer(w, parts)
    assert isinstance(layer.method, CtFp8Linear) and layer.weight_scale.shape == (88, 1)
    direct = torch.cat([q.float() * s for q, s in held])
    x = torch.randn(rows, 200, generator=g)
    layer.method.activations = "weight_only"
    assert torch.equal(layer(x), F.linear(x, direct))
    layer.method.activations = "dynamic"
    xq = Fp8Activation.quantize(x)
    assert torch.equal(layer(x), F.linear(xq.dequantize(), direct))
    assert torch.equal(layer.method.apply(layer, xq), layer(x))
    assert layer.method.takes_fp8(rows)
    assert 1e-4 < _rel(layer(x), F.linear(x, w)) < 0.07


# relative L2 error of the logits against the unquantised bf16 model, per family: measured
# 0.029-0.054 weight-only and 0.038-0.066 with dynamic activations (LLaDA2 the largest; the
# block-scaled "fp8" format measures 0.029-0.055 and 0.039-0.076 on the same models)
FAMILY_BOUND = 0.1


@pytest.mark.parametrize("source", ["tiny-sdar", "tiny-sdar-moe", "tiny-llada", "tiny-llada2"])
def test_logits_of_every_family(made, source):
    """Weight-only and dynamic activations: within FAMILY_BOUND of the unquantised logits,
    and not equal to them (the weights are quantised)."""
    ids = [5, 17, 300, 4096, 77, 12, 9, 100, 200, 1000, 33, 44]
    for mode in ("weight_only", "dynamic"):
        err = _logits_error(made(source, CT), made(source), ids, fp8_activations=mode)
        assert 1e-4 < err < FAMILY_BOUND, (mode, err)


# -- the files -------------------------------------------------------------------------------

def test_files(made):
    """e4m3 weights and fp32 [out, 1] scales for the projections and every expert, quantised
    per row from the same-seed bf16 weights; embeddings, norms, router and the LM head in bf16
    without scales; the hub's quantization_config."""
    path = made("tiny-sdar-moe", CT)
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert cfg == CT_FP8_FORMAT.checkpoint_config(["lm_head"])[0]
    assert {k: cfg[k] for k in ("quant_method", "format", "ignore")} == \
        {k: HUB[k] for k in ("quant_method", "format", "ignore")}
    group = cfg["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    for side in ("weights", "input_activations"):
        hub = HUB["config_groups"]["group_0"][side]
        assert {k: group[side][k] for k in ("num_bits", "type", "strategy", "dynamic",
                                            "symmetric")} == \
            {k: hub[k] for k in ("num_bits", "type", "strategy", "dynamic", "symmetric")}
    q = load_file(path / "model.safetensors")
    ref = load_file(made("tiny-sdar-moe") / "model.safetensors")
    scales = [k for k in q if k.endswith(".weight_scale")]
    assert len(scales) == 2 * (4 + 8 * 3)  # per layer: q, k, v, o and 8 experts x 3
    for key in scales:
        w = key.removesuffix("_scale")
        expect_w, expect_s = quantize_fp8_channel(ref[w])
        assert q[w].dtype == torch.float8_e4m3fn and q[key].dtype == torch.float32
        assert q[key].shape == (ref[w].shape[0], 1)
        assert torch.equal(_bits(q[w]), _bits(expect_w)) and torch.equal(q[key], expect_s)
    for key in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight",
                "model.layers.0.mlp.gate.weight", "model.layers.1.self_attn.q_norm.weight"):
        assert q[key].dtype == torch.bfloat16 and torch.equal(q[key], ref[key])
    assert set(q) == set(ref) | set(scales)


def test_experts_are_held_per_channel(made):
    """Routed experts: w13 [E, 2I, H] e4m3 with [E, 2I, 1] scales (gate rows, then up rows),
    w2 [E, H, I] with [E, H, 1]; the MoE layer dequantises them."""
    path = made("tiny-sdar-moe", CT)
    t = load_file(path / "model.safetensors")
    held = _params(LLM(path))
    e = "model.layers.0.mlp.experts"
    assert torch.equal(held[f"{e}.w13_weight_scale"][3],
                       torch.cat([t[f"{e}.3.gate_proj.weight_scale"],
                                  t[f"{e}.3.up_proj.weight_scale"]]))
    assert torch.equal(held[f"{e}.w2_weight_scale"][5], t[f"{e}.5.down_proj.weight_scale"])
    assert torch.equal(_bits(held[f"{e}.w2"][5]), _bits(t[f"{e}.5.down_proj.weight"]))


def test_hub_checkpoint_is_read(made, tmp_path):
    """The hub's config word for word and its scale dtype (bf16): read as per-channel FP8, the
    scales held in fp32 (exact), generating within the bound of the unquantised logits."""
    def bf16_scales(t):
        for k in [k for k in t if k.endswith(".weight_scale")]:
            t[k] = t[k].to(torch.bfloat16)

    path = _rewrite(made("tiny-sdar", CT), tmp_path / "hub", bf16_scales,
                    lambda q: copy.deepcopy(HUB))
    llm = LLM(path)
    assert llm.engine_config.quantization == CT
    stored = load_file(path / "model.safetensors")
    p = "model.layers.1.self_attn"
    held = _params(llm)
    assert held[f"{p}.o_proj.weight_scale"].dtype == torch.float32
    assert torch.equal(held[f"{p}.o_proj.weight_scale"],
                       stored[f"{p}.o_proj.weight_scale"].float())
    assert torch.equal(held[f"{p}.qkv_proj.weight_scale"],
                       torch.cat([stored[f"{p}.{x}_proj.weight_scale"].float() for x in "qkv"]))
    assert len(_quantised(llm)) == 8 and "lm_head" not in _quantised(llm)
    assert len(llm.generate(PROMPT, max_new_tokens=8).token_ids) == 8
    assert 1e-4 < _logits_error(path, made("tiny-sdar")) < 0.07


def _per_tensor(ref: dict[str, torch.Tensor], shape: tuple[int, ...]):
    """Tensors edit: every quantised weight again with one scale of `shape` ([1] or []) and a
    static input scale [1]."""
    def edit(t):
        for key in [k for k in t if k.endswith(".weight_scale")]:
            w = key.removesuffix("_scale")
            amax = ref[w].float().abs().max()
            t[key] = (amax / 448).reshape(shape)
            t[w] = (ref[w].float() / t[key]).clamp(-448, 448).to(torch.float8_e4m3fn)
            t[key.replace(".weight_scale", ".input_scale")] = torch.tensor([0.02])
    return edit


def _static_tensor(q):
    group = q["config_groups"]["group_0"]
    group["weights"]["strategy"] = "tensor"
    group["input_activations"].update(strategy="tensor", dynamic=False)
    return q


@pytest.mark.parametrize("shape", [(1,), ()])
def test_per_tensor_scales_and_static_input_scales(made, tmp_path, caplog, shape):
    """Weights with one scale each ([1] as compressed-tensors writes it, or []): each part of
    a merged projection keeps its own scale on its rows; static input scales are not used (a
    log line says so); the logits stay within the bound."""
    ref = load_file(made("tiny-sdar") / "model.safetensors")
    path = _rewrite(made("tiny-sdar", CT), tmp_path / "tensor", _per_tensor(ref, shape),
                    _static_tensor)
    with caplog.at_level(logging.INFO, logger="dlrt.checkpoint.loader"):
        llm = LLM(path)
    assert any("input_scale" in r.getMessage() for r in caplog.records)
    stored = load_file(path / "model.safetensors")
    p = "model.layers.0.self_attn"
    fmts = {m.quant_format for m in _quantised(llm).values()}
    assert len(fmts) == 1 and next(iter(fmts)).strategy == "tensor"
    sizes = [ref[f"{p}.{x}_proj.weight"].shape[0] for x in "qkv"]
    want = torch.cat([stored[f"{p}.{x}_proj.weight_scale"].reshape(1).expand(n)
                      for x, n in zip("qkv", sizes, strict=True)])
    assert torch.equal(_params(llm)[f"{p}.qkv_proj.weight_scale"][:, 0], want)
    assert len(llm.generate(PROMPT, max_new_tokens=8).token_ids) == 8
    assert 1e-4 < _logits_error(path, made("tiny-sdar")) < 0.07


def test_weight_only_checkpoint_runs_weight_only(made, tmp_path):
    """A checkpoint without input_activations (W8A16) runs weight-only whatever
    fp8_activations says; one with them runs the option's mode (dynamic by default)."""
    def w8a16(q):
        q["config_groups"]["group_0"]["input_activations"] = None
        return q

    path = _rewrite(made("tiny-sdar", CT), tmp_path / "w8a16", config=w8a16)
    modes = {m.method.activations for m in _quantised(LLM(path)).values()}
    assert modes == {"weight_only"}
    modes = {m.method.activations for m in _quantised(LLM(made("tiny-sdar", CT))).values()}
    assert modes == {"dynamic"}


def test_ignore_regexes(made, tmp_path):
    """`re:` entries of ignore match module names from their start (as compressed-tensors
    matches them): the modules stay in bf16; an entry that is not a regular expression is a
    named error."""
    ref = load_file(made("tiny-sdar") / "model.safetensors")
    mlp = "model.layers.1.mlp"
    parts = [f"{mlp}.{p}_proj" for p in ("gate", "up", "down")]

    def unquantised(t):
        for p in parts:
            del t[f"{p}.weight_scale"]
            t[f"{p}.weight"] = ref[f"{p}.weight"]

    path = _rewrite(made("tiny-sdar", CT), tmp_path / "ignore", unquantised,
                    lambda q: {**q, "ignore": ["lm_head", r"re:.*layers\.1\.mlp\."]})
    llm = LLM(path)
    quantised = _quantised(llm)
    assert f"{mlp}.gate_up_proj" not in quantised and f"{mlp}.down_proj" not in quantised
    assert "model.layers.0.mlp.gate_up_proj" in quantised and len(quantised) == 6
    assert len(llm.generate(PROMPT, max_new_tokens=8).token_ids) == 8
    bad = _rewrite(made("tiny-sdar", CT), tmp_path / "bad", config=lambda q: {
        **q, "ignore": ["re:(lm_head"]})
    with pytest.raises(CheckpointError, match=r"ignore entry 're:\(lm_head' is not a regular"):
        LLM(bad)


def _group(**kw):
    def change(q):
        g = q["config_groups"]["group_0"]
        for side, fields in kw.items():
            if isinstance(fields, dict) and isinstance(g.get(side), dict):
                g[side].update(fields)
            else:
                g[side] = fields
        return q
    return change


def _top(**kw):
    return lambda q: {**q, **kw}


def _two_groups(q):
    other = copy.deepcopy(q["config_groups"]["group_0"])
    other["weights"]["strategy"] = "tensor"
    q["config_groups"]["group_1"] = other
    return q


@pytest.mark.parametrize("change,says", [
    (_group(weights=dict(type="int")), "weights num_bits 8 type 'int'"),
    (_group(weights=dict(num_bits=4)), "weights num_bits 4 type 'float'"),
    (_group(weights=dict(strategy="group", group_size=128)), "weights strategy 'group'"),
    (_group(weights=dict(strategy="block", block_structure=[128, 128])),
     "weights strategy 'block'"),
    (_group(weights=dict(strategy="tensor_group")), "weights strategy 'tensor_group'"),
    (_group(weights=dict(symmetric=False)), "weights symmetric False"),
    (_group(weights=dict(dynamic=True)), "weights dynamic True"),
    (_group(input_activations=dict(type="int")), "input_activations num_bits 8 type 'int'"),
    (_group(input_activations=dict(strategy="group", group_size=128)),
     "input_activations strategy 'group'"),
    (_group(output_activations={"num_bits": 8, "type": "float"}), "output_activations"),
    (_group(targets=[r"re:.*self_attn.*"]), r"targets \['re:\.\*self_attn\.\*'\]"),
    (_top(format="pack-quantized"), "format 'pack-quantized'"),
    (_top(format="int-quantized"), "format 'int-quantized'"),
    (_top(format="naive-quantized"), "format 'naive-quantized'"),
    (_top(format="nvfp4-pack-quantized"), "format 'nvfp4-pack-quantized'"),
    (_top(sparsity_config={"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}),
     "sparsity_config"),
    (_top(transform_config={"config_groups": {"u": {"type": "hadamard"}}}),
     "transform_config"),
    (_top(kv_cache_scheme={"num_bits": 8, "type": "int", "strategy": "tensor"}),
     "kv_cache_scheme num_bits 8 type 'int'"),
    (_top(kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "attn_head"}),
     "kv_cache_scheme strategy 'attn_head'"),
    (_two_groups, "config groups with different schemes"),
    (_top(config_groups={}), "config_groups must be a non-empty object"),
])
def test_unsupported_schemes_are_named(made, change, says):
    """Each scheme dlrt does not run: a CheckpointError naming it and what dlrt reads."""
    q = change(copy.deepcopy(HUB))
    with pytest.raises(CheckpointError, match=says) as e:
        read_scheme({"quantization_config": q}, made("tiny-sdar"))
    assert "config.json quantization_config" in str(e.value)
    assert "dlrt reads" in str(e.value) or "non-empty" in str(e.value)


def test_supported_variants_are_read(made):
    """The other settings dlrt reads: static or dynamic per-tensor activations, a dense
    sparsity config, an FP8 per-tensor KV-cache scheme, a "mixed-precision" folder whose every
    group is float-quantized."""
    folder = made("tiny-sdar")
    for change in (_group(input_activations=dict(strategy="tensor", dynamic=False)),
                   _group(input_activations=dict(strategy="tensor", dynamic=True)),
                   _top(sparsity_config={"format": "dense", "sparsity_structure":
                                         "unstructured"}),
                   _top(kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor",
                                         "dynamic": False, "symmetric": True}),
                   lambda q: {**_group(format="float-quantized")(q),
                              "format": "mixed-precision"}):
        scheme = read_scheme({"quantization_config": change(copy.deepcopy(HUB))}, folder)
        assert scheme.name == CT and scheme.not_convert == ("lm_head",)
        assert scheme.fmt.strategy == "channel"


def test_option_errors(made):
    path = made("tiny-sdar", CT)
    with pytest.raises(OptionError, match="quantization='auto' or 'compressed-tensors-fp8'"):
        LLM(path, quantization="none")
    with pytest.raises(OptionError, match="does not match"):
        LLM(path, quantization="fp8")


def test_cli_make_checkpoint(made, tmp_path):
    from dlrt.entrypoints.cli import main

    out = tmp_path / "cli"
    assert main(["make-checkpoint", "tiny-sdar", str(out), "--quantization", CT]) == 0
    a, b = load_file(out / "model.safetensors"), load_file(made("tiny-sdar", CT) /
                                                          "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(_bits(a[k]), _bits(b[k])) for k in a)


def test_a_quantised_router_is_refused(made, tmp_path):
    """A checkpoint that quantises what dlrt holds unquantised (here the MoE router, which
    compressed-tensors quantises unless `ignore` lists it) is a named error, never e4m3 codes
    read as weights."""
    gate = "model.layers.1.mlp.gate"

    def quantised_gate(t):
        t[f"{gate}.weight"], t[f"{gate}.weight_scale"] = quantize_fp8_channel(
            t[f"{gate}.weight"])

    path = _rewrite(made("tiny-sdar-moe", CT), tmp_path / "gate", quantised_gate)
    with pytest.raises(CheckpointError, match=rf"tensor {gate}\.weight in .* is "
                                              r"torch\.float8_e4m3fn \(quantised\)"):
        LLM(path)
