"""`LLM.update_weights` on the CPU (eager): after an update from a second checkpoint's tensors
(the same tiny preset, another seed) the tokens equal a fresh `LLM` of that checkpoint, for
SDAR, SDAR-MoE, LLaDA, LLaDA2 and DiffusionGemma, for FP8 quantised while loading and read
from a quantised folder, from a mapping, an iterable, a folder and a transformers model (its
fused experts' names; DiffusionGemma's tied encoder entries); tied heads take either name.
Bad weights (unknown or missing names, wrong shapes, dtypes that cannot be cast) raise
`WeightsError` naming them and leave every weight as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlrt import LLM
from dlrt.checkpoint.default import default_model_path
from dlrt.checkpoint.make import make_checkpoint
from dlrt.errors import OptionError, WeightsError

PROMPT = [5, 6, 7, 8, 9, 10]
REQUEST = dict(max_new_tokens=8, temperature=0.0, seed=0, ignore_eos=True)
PRESETS = ["tiny-sdar", "tiny-sdar-moe", "tiny-llada", "tiny-llada2", "tiny-diffusion-gemma"]


def weights_only(src: Path, dst: Path) -> Path:
    """A view of a checkpoint without its tokenizer (it takes seconds to load)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix in (".safetensors",) or f.name in ("config.json", "generation_config.json",
                                                       "model.safetensors.index.json"):
            os.symlink(f, dst / f.name)
    return dst


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """preset -> (folder of seed 0, folder of seed 1), fp32, no tokenizer."""
    made = {}

    def get(preset: str, quantization: str = "none") -> tuple[Path, Path]:
        if (preset, quantization) not in made:
            root = tmp_path_factory.mktemp(f"{preset}-{quantization}")
            made[preset, quantization] = tuple(
                weights_only(make_checkpoint(preset, root / f"full{seed}", seed=seed,
                                             dtype="float32", quantization=quantization),
                             root / f"seed{seed}")
                for seed in (0, 1))
        return made[preset, quantization]
    return get


def tokens(llm: LLM) -> list[int]:
    return llm.generate(PROMPT, **REQUEST).token_ids


def snapshot(llm: LLM) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in llm.model.named_parameters()}


def assert_untouched(llm: LLM, before: dict[str, torch.Tensor]) -> None:
    for n, p in llm.model.named_parameters():
        assert torch.equal(p.detach().view(torch.uint8), before[n].view(torch.uint8)), n


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_update_equals_a_fresh_engine(pair, preset):
    """A mapping of seed 1's tensors into an engine of seed 0: seed 1's tokens; then seed 0's
    folder: seed 0's tokens again (as an iterable of pairs for one family)."""
    a, b = pair(preset)
    llm = LLM(a, dtype="float32")
    want_a, want_b = tokens(llm), tokens(LLM(b, dtype="float32"))
    assert want_a != want_b  # the seeds' models differ where it shows
    llm.update_weights(tensors(b))
    assert tokens(llm) == want_b
    llm.update_weights(a if preset != "tiny-llada" else iter(tensors(a).items()))
    assert tokens(llm) == want_a


@pytest.mark.parametrize("quantization,source", [
    ("fp8", "tensors"), ("fp8", "folder"), ("nvfp4", "tensors"),
    ("compressed-tensors-fp8", "tensors")])
def test_online_quantised_update_is_requantised(pair, quantization, source):
    """Quantised while loading (FP8 block-scaled, NVFP4, compressed-tensors FP8): the
    high-precision tensors of seed 1 are quantised by the format (the held codes and scales
    equal a fresh engine's bit for bit) and the tokens equal a fresh engine of seed 1."""
    a, b = pair("tiny-sdar-moe")
    llm = LLM(a, dtype="float32", quantization=quantization)
    fresh = LLM(b, dtype="float32", quantization=quantization)
    want_a, want_b = tokens(llm), tokens(fresh)
    assert want_a != want_b
    llm.update_weights(tensors(b) if source == "tensors" else b)
    assert tokens(llm) == want_b
    held, ref = dict(llm.model.named_parameters()), dict(fresh.model.named_parameters())
    assert any("experts.w13_weight_scale" in n for n in held)
    for n in held:
        assert torch.equal(held[n].view(torch.uint8), ref[n].view(torch.uint8)), n


def test_quantised_folder_is_read_as_stored(pair):
    """An engine of an fp8 folder updated from another fp8 folder (FP8 codes and their
    scales) equals a fresh engine of that folder."""
    a, b = pair("tiny-sdar", "fp8")
    llm = LLM(a, dtype="float32")
    want_b = tokens(LLM(b, dtype="float32"))
    assert tokens(llm) != want_b
    llm.update_weights(b)
    assert tokens(llm) == want_b


def _qwen3_moe(src: Path, dst: Path):
    """transformers' Qwen3-MoE (the SDAR-MoE layout) from a copy of `src`."""
    import transformers

    dst.mkdir()
    os.symlink(src / "model.safetensors", dst / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"])
    (dst / "config.json").write_text(json.dumps(cfg))
    model, info = transformers.Qwen3MoeForCausalLM.from_pretrained(
        str(dst), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model


def test_transformers_model_with_fused_experts(pair, tmp_path):
    """A transformers Qwen3-MoE model of seed 1 (its state_dict holds the experts fused:
    `mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) updates an
    SDAR-MoE engine of seed 0 to seed 1's tokens."""
    a, b = pair("tiny-sdar-moe")
    model = _qwen3_moe(b, tmp_path / "hf")
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in model.state_dict())
    llm = LLM(a, dtype="float32")
    want_b = tokens(LLM(b, dtype="float32"))
    llm.update_weights(model)
    assert tokens(llm) == want_b


def test_transformers_diffusion_gemma_tied_entries(pair):
    """transformers' DiffusionGemma of seed 1: its state_dict repeats the decoder's tensors
    under the encoder's names (tied, one storage) and holds a vision tower dlrt does not
    serve; both are accepted, and the tokens equal seed 1's."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
        pytest.skip("this transformers has no DiffusionGemma")
    a, b = pair("tiny-diffusion-gemma")
    model = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(str(b),
                                                                       dtype=torch.float32)
    names = model.state_dict()
    assert any(k.startswith("model.encoder.language_model.layers.0.self_attn") for k in names)
    llm = LLM(a, dtype="float32")
    want_b = tokens(LLM(b, dtype="float32"))
    llm.update_weights(model)
    assert tokens(llm) == want_b


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """The embedded default model (its LM head tied to the embedding) and a checkpoint of its
    config with seed 1."""
    out = tmp_path_factory.mktemp("tied")
    cfg = json.loads((default_model_path() / "config.json").read_text())
    assert cfg["tie_word_embeddings"]
    return default_model_path(), make_checkpoint(default_model_path(), out / "seed1", seed=1)


@pytest.mark.parametrize("names", ["checkpoint", "both", "head_only", "both_shared"])
def test_tied_head_takes_either_name(tied, names):
    """A tied LM head: the checkpoint's one name, both names (two tensors, or one tensor
    under two names as a state_dict has them), or only `lm_head.weight`."""
    default, b = tied
    w = tensors(b)
    emb = w["model.embed_tokens.weight"]
    if names == "both":
        w["lm_head.weight"] = emb.clone()
    elif names == "both_shared":
        w["lm_head.weight"] = emb
    elif names == "head_only":
        w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    llm = LLM(default)
    want = tokens(LLM(b))
    llm.update_weights(w)
    assert llm.model.lm_head.weight is llm.model.model.embed_tokens.weight
    assert tokens(llm) == want


def test_tied_alias_of_the_wrong_shape(tied):
    default, b = tied
    w = tensors(b)
    w["lm_head.weight"] = w["model.embed_tokens.weight"][:-1].clone()
    llm = LLM(default)
    before = snapshot(llm)
    with pytest.raises(WeightsError, match="lm_head.weight"):
        llm.update_weights(w)
    assert_untouched(llm, before)


def _bad(w: dict[str, torch.Tensor], case: str) -> tuple[dict, str]:
    """`w` spoiled as `case` says, and what the error must name."""
    q = "model.layers.0.self_attn.q_proj.weight"
    if case == "unknown":
        w["model.layers.0.self_attn.q_proj.weight_typo"] = w[q].clone()
        return w, "q_proj.weight_typo"
    if case == "missing":
        del w[q], w["lm_head.weight"]
        return w, "missing.*q_proj.weight"
    if case == "shape":
        w[q] = w[q][:, :-1].clone()
        return w, f"{q}.*shape"
    if case == "integer":
        w[q] = torch.zeros(w[q].shape, dtype=torch.int32)
        return w, f"{q}.*int32"
    if case == "float8":  # codes without a scale for an unquantised layer
        w[q] = w[q].to(torch.float8_e4m3fn)
        return w, f"{q}.*float8"
    raise AssertionError(case)


@pytest.fixture(scope="module")
def sdar(pair):
    a, b = pair("tiny-sdar")
    return LLM(a, dtype="float32"), b


@pytest.mark.parametrize("case", ["unknown", "missing", "shape", "integer", "float8"])
def test_bad_weights_are_named_and_change_nothing(sdar, case):
    """The last tensor is right, so a half-applied update would show; the error lists the
    problem (with the other problems of the same update) and says nothing was updated."""
    llm, b = sdar
    before = snapshot(llm)
    w, named = _bad(tensors(b), case)
    w["model.layers.1.mlp.down_proj.weight"] = w.pop("model.layers.1.mlp.down_proj.weight")
    with pytest.raises(WeightsError, match=named) as e:
        llm.update_weights(w)
    assert "nothing was updated" in str(e.value)
    assert_untouched(llm, before)


def test_every_problem_in_one_error(sdar):
    llm, b = sdar
    w = tensors(b)
    w["extra.weight"] = torch.zeros(1)
    del w["model.norm.weight"]
    w["lm_head.weight"] = w["lm_head.weight"][:5].clone()
    with pytest.raises(WeightsError) as e:
        llm.update_weights(w)
    msg = str(e.value)
    assert "extra.weight" in msg and "model.norm.weight" in msg and "lm_head.weight" in msg


def test_not_strict_updates_what_is_given(sdar):
    llm, b = sdar
    before = snapshot(llm)
    w = tensors(b)
    part = {k: v for k, v in w.items() if k.startswith("model.layers.1.")}
    with pytest.raises(WeightsError, match="missing"):
        llm.update_weights(part)
    llm.update_weights(part, strict=False)
    for n, p in llm.model.named_parameters():
        if n.startswith("model.layers.1.") and p.dim() > 1:  # (norms: ones in every seed)
            assert not torch.equal(p, before[n]), n
        elif not n.startswith("model.layers.1."):
            assert torch.equal(p, before[n]), n
    assert torch.equal(llm.model.model.layers[1].mlp.down_proj.weight,
                       part["model.layers.1.mlp.down_proj.weight"])
    llm.update_weights(w)  # back to a whole checkpoint


def test_other_float_dtypes_are_cast(sdar):
    """bf16 tensors into an fp32 engine: each parameter holds the bf16 value in fp32."""
    llm, b = sdar
    w = {k: v.to(torch.bfloat16) for k, v in tensors(b).items()}
    llm.update_weights(w)
    got = dict(llm.model.named_parameters())
    assert torch.equal(got["lm_head.weight"], w["lm_head.weight"].float())
    assert got["lm_head.weight"].dtype == torch.float32


@pytest.mark.parametrize("weights,match", [
    (42, "mapping or an iterable"),
    ([("a", 1)], "torch.Tensor"),
    ([("model.norm.weight", torch.ones(64)), ("model.norm.weight", torch.ones(64))],
     "given twice"),
])
def test_weights_of_the_wrong_kind(sdar, weights, match):
    llm, _ = sdar
    with pytest.raises(WeightsError, match=match):
        llm.update_weights(weights)


def test_another_family_folder_is_refused(sdar, pair):
    llm, _ = sdar
    before = snapshot(llm)
    with pytest.raises(WeightsError, match="names the model does not have"):
        llm.update_weights(pair("tiny-llada")[1])
    assert_untouched(llm, before)


def test_fp8_kv_cache_takes_the_scales(pair):
    """An FP8 KV cache takes the weights' k_scale / v_scale (every layer) in place; scales of
    some layers only are refused with the rest."""
    a, b = pair("tiny-sdar")
    llm = LLM(a, dtype="float32", kv_cache_dtype="fp8")
    layers = llm.config.num_layers
    k_scale = llm.kv_cache.k_scale
    assert k_scale.tolist() == [1.0] * layers
    w = tensors(b)
    scales = {f"model.layers.{i}.self_attn.{s}": torch.tensor(2.0 + i)
              for i in range(layers) for s in ("k_scale", "v_scale")}
    before = snapshot(llm)
    with pytest.raises(WeightsError, match="lacks"):
        llm.update_weights({**w, "model.layers.0.self_attn.k_scale": torch.tensor(3.0)})
    assert_untouched(llm, before)
    assert llm.kv_cache.k_scale.tolist() == [1.0] * layers
    llm.update_weights({**w, **scales})
    assert llm.kv_cache.k_scale is k_scale  # the same memory, new values
    assert llm.kv_cache.k_scale.tolist() == llm.kv_cache.v_scale.tolist() == \
        [2.0 + i for i in range(layers)]


def test_meta_tensors_and_a_non_bool_strict_are_refused_before_any_copy(sdar):
    llm, b = sdar
    before = snapshot(llm)
    w = tensors(b)
    name = next(iter(w))
    with pytest.raises(WeightsError, match="is a meta tensor .no data.; nothing was updated"):
        llm.update_weights({**w, name: torch.empty_like(w[name], device="meta")})
    with pytest.raises(OptionError, match="strict must be True or False, got 'yes'"):
        llm.update_weights(w, strict="yes")
    for n, p in llm.model.named_parameters():
        assert torch.equal(p, before[n]), n
