"""Quantised DiffusionGemma on the CPU: online quantisation (`quantization="fp8"`, NVFP4,
compressed-tensors FP8) holds bit for bit what make-checkpoint writes and commits the same
tokens; the files (routed experts one tensor per expert and part, quantised from the rows of
the stacked bf16 tensors; routers, embeddings, norms and layer scalars unquantised); weight-only
products equal the unquantised model on the dequantised weights; checkpoints in the published
layouts (compressed-tensors FP8 with the hub's `ignore` list, experts left stacked in bf16,
ModelOpt's `hf_quant_config.json` with wildcards); the real config's layout on the meta
device; the Triton MoE reading the model's FP8 GELU experts; and the named errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.quant import QuantScheme, quantize_model
from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.quant.compressed_tensors import quantize_fp8_channel
from dlrt.layers.quant.fp8 import FP8_FORMAT, FP8_ROWS_FORMAT, quantize_fp8_block
from dlrt.models.registry import build_model, model_config
from dlrt.ops import reference

TINY = "tiny-diffusion-gemma"
CT = "compressed-tensors-fp8"
FORMATS = ["fp8", "nvfp4", CT]
PROMPT = [5, 17, 300, 4096, 77, 12, 9]
CANVAS = [40, 41, 7000, 3, 3, 900, 12, 5, 8100, 64, 2, 77, 300, 4, 5, 6]
OPTIONS = dict(max_new_tokens=8, seed=0, max_denoising_steps=12)
LAYER = "model.decoder.layers.1"
SELF_CONDITIONING = "model.decoder.self_conditioning"
# quantised modules: per layer qkv, o, the dense MLP's gate-up and down, the routed experts;
# the self-conditioning MLP's gate-up and down
QUANTISED = 4 * 5 + 2
# the `ignore` list of the hub's compressed-tensors FP8 DiffusionGemma checkpoints
HUB_IGNORE = ["lm_head", "re:.*embed.*", "re:.*router.*", "re:.*vision_tower.*",
              "re:.*self_conditioning.*"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """quantization -> the tiny preset's checkpoint (seed 0, bf16) written once."""
    cache: dict = {}

    def get(quantization: str = "none") -> Path:
        if quantization not in cache:
            out = tmp_path_factory.mktemp("dg-quant") / "ckpt"
            cache[quantization] = make_checkpoint(TINY, out, quantization=quantization)
        return cache[quantization]
    return get


def _params(llm: LLM) -> dict[str, torch.Tensor]:
    return dict(llm.engine.model.named_parameters())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _quantised(llm: LLM) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in llm.engine.model.named_modules()
            if getattr(m, "quant_format", None) is not None}


def _generate(llm: LLM) -> tuple[list[int], list[int]]:
    r = llm.generate(PROMPT, **OPTIONS)
    return r.token_ids, r.denoise_steps


def _logits(llm: LLM) -> torch.Tensor:
    """The encoder's logits of PROMPT and a decoder pass's of CANVAS after it, self-conditioned
    by fixed logits: [P + L, V] fp32 (every projection, the experts and the self-conditioning
    MLP take part)."""
    r, p, n = llm.runner, len(PROMPT), len(CANVAS)
    encoded = r.forward_at(torch.tensor(PROMPT), 0, chunk_block=1)
    signal = torch.randn(n, encoded.shape[1], generator=torch.Generator().manual_seed(1)) * 4
    decoded = r.forward(torch.tensor(CANVAS), r.lens(p, p + n), None, slice(None),
                        self_conditioning=signal)
    return torch.cat([encoded, decoded])


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


def _rewrite(src: Path, dst: Path, tensors=None, config=None) -> Path:
    """A copy of a single-file checkpoint; `tensors(t)` edits its tensors, `config(cfg)` its
    config.json."""
    shutil.copytree(src, dst)
    t = load_file(src / "model.safetensors")
    if tensors is not None:
        tensors(t)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# -- online quantisation and the files --------------------------------------------------------

@pytest.mark.parametrize("quantization", FORMATS)
def test_online_equals_the_written_checkpoint(made, quantization):
    """LLM(bf16 folder, quantization=q) holds bit for bit what LLM(make-checkpoint
    --quantization q) holds and commits the same tokens and rounds; the routed experts, every
    projection and the self-conditioning MLP are quantised, the routers and the LM head not."""
    offline = LLM(made(quantization))
    online = LLM(made(), quantization=quantization)
    assert offline.engine_config.quantization == online.engine_config.quantization \
        == quantization
    a, b = _params(offline), _params(online)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(_bits(a[name]), _bits(b[name])), name
    quantised = _quantised(offline)
    assert len(quantised) == QUANTISED, sorted(quantised)
    assert {f"{LAYER}.experts", f"{LAYER}.mlp.gate_up_proj", f"{LAYER}.self_attn.qkv_proj",
            f"{SELF_CONDITIONING}.gate_up_proj", f"{SELF_CONDITIONING}.down_proj"} <= \
        set(quantised)
    assert not any("router" in n or n == "lm_head" for n in quantised)
    assert a[f"{LAYER}.router.proj.weight"].dtype == torch.float32
    assert _generate(offline) == _generate(online)


def test_fp8_files(made):
    """FP8: each expert's gate, up and down rows of the stacked bf16 tensors as e4m3 with
    their 128x128 block scales (the published per-expert layout; no stacked tensor left);
    projections likewise; routers, embeddings, norms, layer scalars and the router scales in
    bf16 as written unquantised; the routers and the head listed as not converted."""
    q = load_file(made("fp8") / "model.safetensors")
    ref = load_file(made() / "model.safetensors")
    experts = f"{LAYER}.experts"
    gate_up, down = ref[f"{experts}.gate_up_proj"], ref[f"{experts}.down_proj"]
    i = gate_up.shape[1] // 2
    for e in range(gate_up.shape[0]):
        for part, w in (("gate_proj", gate_up[e, :i]), ("up_proj", gate_up[e, i:]),
                        ("down_proj", down[e])):
            codes, scale = quantize_fp8_block(w)
            key = f"{experts}.{e}.{part}.weight"
            assert torch.equal(_bits(q[key]), _bits(codes)), key
            assert torch.equal(q[f"{key}_scale_inv"], scale), key
    assert not any(k.endswith(("gate_up_proj", "experts.down_proj")) for k in q)
    for key in (f"{LAYER}.router.proj.weight", f"{LAYER}.router.scale",
                f"{LAYER}.router.per_expert_scale", "model.decoder.embed_tokens.weight",
                f"{LAYER}.post_feedforward_layernorm_2.weight", f"{LAYER}.layer_scalar",
                "model.encoder.language_model.layers.1.layer_scalar",
                f"{SELF_CONDITIONING}.pre_norm.weight"):
        assert q[key].dtype == torch.bfloat16 and torch.equal(q[key], ref[key]), key
    for key in (f"{SELF_CONDITIONING}.gate_proj.weight", f"{LAYER}.self_attn.k_proj.weight"):
        assert torch.equal(_bits(q[key]), _bits(quantize_fp8_block(ref[key])[0])), key
    cfg = json.loads((made("fp8") / "config.json").read_text())["quantization_config"]
    assert cfg["modules_to_not_convert"] == ["lm_head"] + [
        f"model.decoder.layers.{n}.router.proj" for n in range(4)]


def test_dummy_weights_equal_the_written_checkpoint(made):
    """load_format='dummy' with quantization='fp8' draws and quantises what make-checkpoint
    writes, the stacked experts' rows included."""
    dummy = LLM(made(), load_format="dummy", quantization="fp8", dtype="bfloat16")
    files = LLM(made("fp8"), dtype="bfloat16")
    a, b = _params(dummy), _params(files)
    assert all(torch.equal(_bits(a[n]), _bits(b[n])) for n in a)


def test_cli_quantises_while_loading(made, capsys):
    from dlrt.entrypoints.cli import main

    ids = ",".join(map(str, PROMPT))
    assert main(["generate", "--model", str(made()), "--prompt-ids", ids, "--quantization",
                 "fp8", "--max-new-tokens", "8", "--seed", "0", "--max-denoising-steps", "12",
                 "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == _generate(LLM(made("fp8")))[0]


# -- numerics ---------------------------------------------------------------------------------

@pytest.mark.parametrize("quantization", FORMATS)
def test_weight_only_equals_the_dequantised_model(made, quantization):
    """Weight-only: the logits equal (here bit for bit) the unquantised fp32 model's on the
    dequantised weights, and so do the tokens and rounds; they differ from the unquantised
    model's, and with dynamic activations (FP8's default) from weight-only.

    No bound against the unquantised model is held here: the tiny random preset amplifies
    weight noise (0.1% relative noise on its projections moves its logits by 5% relative L2;
    FP8 by 24-35%), so the formats' accuracy is held on the other families
    (test_quant_checkpoint.py, test_quant_compressed_tensors.py)."""
    quant = LLM(made(quantization), fp8_activations="weight_only")
    plain = LLM(made())
    base = _logits(plain)
    _dequantised_copy(quant, plain)
    ours = _logits(quant)
    assert _rel(ours, _logits(plain)) < 1e-6
    assert _generate(quant) == _generate(plain)
    assert _rel(ours, base) > 1e-3
    if quantization != "nvfp4":
        assert _rel(_logits(LLM(made(quantization))), ours) > 1e-3


@pytest.mark.parametrize("quantization", ["fp8", CT])
def test_triton_moe_reads_the_fp8_gelu_experts(made, quantization):
    """The loaded model's FP8 experts (I = 32: block scales a row per weight row; or
    per-channel scales) through the Triton MoE (TRITON_INTERPRET=1 on the CPU) without being
    dequantised equal the reference MoE, routed by the model's router; a canvas of 16 rows
    takes the grouped-GEMM form."""
    from dlrt.layers.moe.reference import ReferenceMoE
    from dlrt.layers.moe.triton import TritonMoE, fp8_blocks

    pytest.importorskip("triton")
    layer = LLM(made(quantization)).engine.model.model.decoder.layers[1]
    assert layer.experts.activation == "gelu_pytorch_tanh" and fp8_blocks(layer.experts)
    assert quantization != "fp8" or layer.experts.quant_format is FP8_ROWS_FORMAT
    for rows in (3, 16):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        weights, ids = layer.router(x, ReferenceMoE())
        ref = ReferenceMoE().apply(layer, x, weights, ids)
        layer.experts.expert_weight = None  # NOTE: any dequantising call fails
        try:
            out = TritonMoE().apply(layer, x, weights, ids)
        finally:
            del layer.experts.expert_weight
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-5, (rows, err)


def test_the_real_config_on_the_meta_device():
    """DiffusionGemma-26B-A4B-it quantised to FP8 on the meta device: attention projections and
    down projections in block rows; the gate-up projections of the dense and self-conditioning
    MLPs and the experts (gate / up parts of 2112 and 704 rows) with a scale row per weight
    row, which the Triton MoE reads directly; the routers unquantised."""
    from dlrt.checkpoint.presets import real_config
    from dlrt.layers.moe.triton import fp8_blocks

    hf = json.loads((real_config("DiffusionGemma-26B-A4B-it") / "config.json").read_text())
    config = model_config(hf)
    with torch.device("meta"):
        model = build_model(config, reference.OPS)
    names = quantize_model(model, config.hidden_size, QuantScheme("fp8", online=True))
    assert len(names) == 30 * 5 + 2 and not any("router" in n for n in names)
    modules = dict(model.named_modules())
    layer = "model.decoder.layers.5"
    assert modules[f"{layer}.self_attn.qkv_proj"].quant_format is FP8_FORMAT
    assert modules[f"{layer}.mlp.gate_up_proj"].quant_format is FP8_ROWS_FORMAT
    assert modules[f"{SELF_CONDITIONING}.gate_up_proj"].quant_format is FP8_ROWS_FORMAT
    assert modules[f"{SELF_CONDITIONING}.down_proj"].quant_format is FP8_FORMAT  # one part
    experts = modules[f"{layer}.experts"]
    assert experts.quant_format is FP8_ROWS_FORMAT and fp8_blocks(experts)
    assert experts.w13_weight_scale_inv.shape == (128, 1408, 22)
    assert experts.w2_weight_scale_inv.shape == (128, 2816, 6)
    assert modules[f"{layer}.router.proj"].weight.dtype != torch.float8_e4m3fn


# -- the published layouts --------------------------------------------------------------------

def _hub_config(cfg):
    """config.json of a hub compressed-tensors FP8 DiffusionGemma checkpoint: its ignore list,
    bf16 scales' config fields as llm-compressor writes them."""
    q = cfg["quantization_config"]
    q.update(ignore=list(HUB_IGNORE), global_compression_ratio=1.87, version="0.12.2")
    for side in ("weights", "input_activations"):
        q["config_groups"]["group_0"][side].update(observer="minmax", observer_kwargs={})


def test_hub_compressed_tensors_checkpoint(made, tmp_path):
    """The hub's layout: experts per expert and part with bf16 per-channel scales, the
    self-conditioning MLP and the routers in bf16 under `re:` ignore entries, a vision tower
    (skipped): the self-conditioning MLP stays unquantised, the rest reads as written; it
    generates."""
    ref = load_file(made() / "model.safetensors")

    def hub(t):
        for key in [k for k in t if k.endswith(".weight_scale")]:
            t[key] = t[key].to(torch.bfloat16)
        for part in ("gate_proj", "up_proj", "down_proj"):
            key = f"{SELF_CONDITIONING}.{part}.weight"
            t[key] = ref[key]
            del t[f"{key}_scale"]
        t["model.encoder.vision_tower.encoder.layers.0.mlp.fc1.weight"] = \
            torch.zeros(16, 16, dtype=torch.bfloat16)

    path = _rewrite(made(CT), tmp_path / "hub", hub, _hub_config)
    llm = LLM(path)
    assert llm.engine_config.quantization == CT
    quantised = _quantised(llm)
    assert len(quantised) == QUANTISED - 2 and f"{LAYER}.experts" in quantised
    assert not any(n.startswith(SELF_CONDITIONING) for n in quantised)
    held = _params(llm)
    assert held[f"{SELF_CONDITIONING}.down_proj.weight"].dtype == torch.float32
    experts = f"{LAYER}.experts"
    stored = load_file(path / "model.safetensors")
    assert torch.equal(held[f"{experts}.w13_weight_scale"][2],
                       torch.cat([stored[f"{experts}.2.{p}.weight_scale"].float()
                                  for p in ("gate_proj", "up_proj")]))
    assert len(llm.generate(PROMPT, **OPTIONS).token_ids) == 8


def test_experts_left_stacked_by_the_quantiser(made, tmp_path):
    """A compressed-tensors checkpoint whose quantiser left the stacked experts (no linear
    layers) in bf16: they load unquantised, every projection quantised."""
    ref = load_file(made() / "model.safetensors")

    def stacked(t):
        for key in [k for k in t if ".experts." in k]:
            del t[key]
        t.update({k: v for k, v in ref.items() if k.endswith(("experts.gate_up_proj",
                                                              "experts.down_proj"))})

    llm = LLM(_rewrite(made(CT), tmp_path / "stacked", stacked))
    quantised = _quantised(llm)
    assert len(quantised) == QUANTISED - 4 and not any("experts" in n for n in quantised)
    assert _params(llm)[f"{LAYER}.experts.w13"].dtype == torch.float32
    assert len(llm.generate(PROMPT, **OPTIONS).token_ids) == 8


def test_modelopt_hf_quant_config_with_wildcards(made, tmp_path):
    """ModelOpt's export form: hf_quant_config.json alone (no quantization_config), its
    exclude_modules with fnmatch wildcards naming the routers, the vision tower, the
    self-conditioning MLP and the attention projections (NVIDIA's Gemma 4 recipe quantises the
    feed-forward layers only), those stored in bf16: the MLPs and experts are NVFP4."""
    ref = load_file(made() / "model.safetensors")

    def bf16_attention_and_self_conditioning(t):
        keys = [k.removesuffix("_scale_2") for k in t if k.endswith(".weight_scale_2")
                and (".self_attn." in k or k.startswith(SELF_CONDITIONING))]
        for key in keys:
            t[key] = ref[key]
            for suffix in ("_scale", "_scale_2"):
                del t[key + suffix]

    path = _rewrite(made("nvfp4"), tmp_path / "modelopt", bf16_attention_and_self_conditioning,
                    lambda cfg: cfg.pop("quantization_config"))
    (path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.41.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                         "exclude_modules": ["lm_head", "*router*", "*self_attn*",
                                             "model.encoder.vision_tower*",
                                             f"{SELF_CONDITIONING}*"]}}))
    llm = LLM(path)
    assert llm.engine_config.quantization == "nvfp4"
    assert sorted(_quantised(llm)) == sorted(
        f"model.decoder.layers.{n}.{m}" for n in range(4)
        for m in ("mlp.gate_up_proj", "mlp.down_proj", "experts"))
    assert _params(llm)[f"{LAYER}.self_attn.qkv_proj.weight"].dtype == torch.float32
    assert len(llm.generate(PROMPT, **OPTIONS).token_ids) == 8


# -- errors -----------------------------------------------------------------------------------

def _quantised_router(t):
    key = f"{LAYER}.router.proj.weight"
    t[key], t[f"{LAYER}.router.proj.weight_scale"] = quantize_fp8_channel(t[key])


def _fp8_stacked_experts(t):
    for key in [k for k in t if k.startswith(f"{LAYER}.experts.")]:
        del t[key]
    for part, shape in (("gate_up_proj", (4, 64, 64)), ("down_proj", (4, 64, 32))):
        t[f"{LAYER}.experts.{part}"] = torch.zeros(shape, dtype=torch.float8_e4m3fn)


def _int8(cfg):
    q = cfg["quantization_config"]
    q["format"] = "int-quantized"
    q["config_groups"]["group_0"]["weights"]["type"] = "int"


def _half_ignored(cfg):
    cfg["quantization_config"]["ignore"].append(f"re:{SELF_CONDITIONING}.gate_proj$")


@pytest.mark.parametrize("tensors,config,error", [
    (_quantised_router, None, rf"tensor {LAYER}\.router\.proj\.weight in .* is "
                              r"torch\.float8_e4m3fn \(quantised\)"),
    (_fp8_stacked_experts, None, rf"tensor {LAYER}\.experts\.gate_up_proj in .* is "
                                 r"torch\.float8_e4m3fn \(quantised\)"),
    (None, _int8, r"format 'int-quantized' is not supported; dlrt reads"),
    (None, _half_ignored, rf"covers some parts of {SELF_CONDITIONING}\.gate_up_proj"),
])
def test_checkpoints_dlrt_does_not_run_are_named(made, tmp_path, tensors, config, error):
    """A quantised router or quantised stacked experts (dlrt keeps them in the model dtype),
    an INT8 scheme, an ignore list that splits a merged projection: CheckpointError."""
    path = _rewrite(made(CT), tmp_path / "bad", tensors, config)
    with pytest.raises(CheckpointError, match=error):
        LLM(path)


def test_option_errors(made):
    with pytest.raises(OptionError, match="does not match"):
        LLM(made(CT), quantization="nvfp4")
    with pytest.raises(OptionError, match="quantization='auto' or 'fp8'"):
        LLM(made("fp8"), quantization="none")
    with pytest.raises(OptionError, match=r"quantization 'int8'.*'fp8'"):
        LLM(made(), quantization="int8")

