"""Checkpoint folders: writing them (`make_checkpoint`), their tensor names against the real
SDAR/LLaDA layouts, loading them through `LLM`, and every way a folder or an option can be bad."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dlrt import LLM, CheckpointError, ConfigError, OptionError
from dlrt.checkpoint import default as default_mod
from dlrt.checkpoint import make as make_mod
from dlrt.checkpoint.default import default_model_path
from dlrt.checkpoint.folder import INDEX_NAME
from dlrt.checkpoint.loader import random_tensor, weight_specs
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import PRESETS
from dlrt.decoding.options import DecodingOptions
from dlrt.entrypoints.cli import main as cli_main
from dlrt.models.registry import build_model, model_config
from dlrt.ops import reference
from dlrt.resources import data_path
from dlrt.tokenizer import load_tokenizer

MODELS = Path(__file__).resolve().parents[2] / "dlrt" / "data" / "configs"
SDAR_4B = MODELS / "SDAR-4B-Chat"
SDAR_30B = MODELS / "SDAR-30B-A3B-Chat"
LLADA_8B = MODELS / "LLaDA-8B-Instruct"
LLADA2 = MODELS / "LLaDA2.0-mini"
SHARD_BYTES = 10**7  # tiny-sdar in bf16: embed and lm_head (19 MB each) alone, layers together
TOKENIZER_FILES = ("tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja",
                   "special_tokens_map.json", "added_tokens.json")

needs_real = pytest.mark.skipif(not SDAR_4B.is_dir(), reason="dlrt/data/configs is not present")


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def meta_model(hf: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(model_config(hf), reference.OPS)


def meta_specs(hf: dict) -> dict[str, tuple[int, ...]]:
    return {s.key: s.shape for s in weight_specs(meta_model(hf))}


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def clone(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint whose (read-only) safetensors files are symlinks to `src`."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            os.symlink(f, dst / f.name)
        else:
            shutil.copyfile(f, dst / f.name)
    return dst


def rewrite_weights(folder: Path, edit) -> None:
    """Replace model.safetensors by `edit(tensors)` (unlinks first: never writes through a
    symlink into the shared fixture)."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    path.unlink()
    save_file(tensors, str(path))


def edit_config(folder: Path, **changes) -> None:
    """Set config.json fields; a value of None deletes the field."""
    hf = read_config(folder)
    for k, v in changes.items():
        if v is None:
            hf.pop(k, None)
        else:
            hf[k] = v
    (folder / "config.json").write_text(json.dumps(hf))


def params(llm: LLM) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in llm.model.named_parameters()}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    return make_checkpoint("tiny-sdar", tmp_path_factory.mktemp("sharded") / "ckpt", seed=7,
                           max_shard_bytes=SHARD_BYTES)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    return make_checkpoint("tiny-sdar", tmp_path_factory.mktemp("single") / "ckpt", seed=7)


# --- make_checkpoint: layout, values, determinism -------------------------------------------


def test_sharded_layout_and_index(sharded):
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    n = len(files)
    assert n == 3, files
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((sharded / INDEX_NAME).read_text())
    specs = meta_specs(read_config(sharded))
    assert set(index["weight_map"]) == set(specs)
    total = 0
    for name, fname in index["weight_map"].items():
        with safe_open(sharded / fname, framework="pt") as f:
            assert name in f.keys()
            t = f.get_tensor(name)
        assert tuple(t.shape) == specs[name] and t.dtype == torch.bfloat16
        total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    assert total == 2 * sum(torch.Size(s).numel() for s in specs.values())
    # every shard holds exactly the tensors the index gives it
    for fname in files:
        with safe_open(sharded / fname, framework="pt") as f:
            assert set(f.keys()) == {k for k, v in index["weight_map"].items() if v == fname}


def test_sharded_loads_equal_to_dummy_weights(sharded):
    loaded = params(LLM(sharded, dtype="bfloat16"))
    dummy = params(LLM(sharded, dtype="bfloat16", load_format="dummy", seed=7))
    other = params(LLM(sharded, dtype="bfloat16", load_format="dummy", seed=8))
    assert loaded.keys() == dummy.keys()
    for name, t in loaded.items():
        assert t.dtype == torch.bfloat16
        assert torch.equal(t, dummy[name]), name
        if t.dim() > 1:
            assert not torch.equal(t, other[name]), name


def test_sharding_does_not_change_values(sharded, single):
    assert [p.name for p in single.glob("*.safetensors")] == ["model.safetensors"]
    assert not (single / INDEX_NAME).exists()
    a, b = read_tensors(sharded), read_tensors(single)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_same_seed_same_bytes_other_seed_other_values(single, tmp_path):
    again = make_checkpoint("tiny-sdar", tmp_path / "again", seed=7)
    assert (again / "model.safetensors").read_bytes() == (single / "model.safetensors").read_bytes()
    other = read_tensors(make_checkpoint("tiny-sdar", tmp_path / "other", seed=8))
    for k, t in read_tensors(single).items():
        if t.dim() == 1:
            assert torch.equal(t, other[k]), k  # norms are ones whatever the seed
        else:
            assert not torch.equal(t, other[k]), k


def test_values_are_the_seeded_draws(single):
    specs = weight_specs(meta_model(read_config(single)))
    tensors = read_tensors(single)
    for s in specs:
        assert torch.equal(tensors[s.key], random_tensor(s, 7, 0.02, torch.bfloat16, "cpu")), s.key


@pytest.mark.parametrize("family,std_key,std", [("tiny-sdar", "initializer_range", 0.05),
                                                ("tiny-llada", "init_std", 0.1)])
def test_norms_ones_and_std_from_config(tmp_path, family, std_key, std):
    hf = dict(PRESETS[family], **{std_key: std, "vocab_size": 512, "mask_token_id": 511})
    if family == "tiny-llada":
        hf["embedding_size"] = 512
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(hf))
    out = make_checkpoint(src, tmp_path / "out", dtype="float32")
    tensors = read_tensors(out)
    assert set(tensors) == set(meta_specs(hf))
    for k, t in tensors.items():
        if t.dim() == 1:
            assert torch.equal(t, torch.ones_like(t)), k
        else:
            assert abs(t.std().item() - std) < 0.1 * std, (k, t.std().item())
            assert abs(t.mean().item()) < 0.1 * std, k


def test_tiny_sdar_stds(tiny_sdar):
    for k, t in read_tensors(tiny_sdar).items():
        assert t.dtype == torch.float32
        if t.dim() == 1:
            assert torch.equal(t, torch.ones_like(t)), k
        else:
            assert abs(t.std().item() - 0.02) < 0.002, k


# --- tensor names against the real checkpoints ------------------------------------------------


def _top_and_layer0(names) -> set[str]:
    return {n for n in names if ".layers." not in n or ".layers.0." in n}


@needs_real
def test_sdar_names_match_real_sdar_4b_index(tiny_sdar):
    index = json.loads((SDAR_4B / INDEX_NAME).read_text())
    real = set(index["weight_map"])
    specs = meta_specs(read_config(SDAR_4B))
    assert set(specs) == real
    # bf16 bytes of the full model equal the real checkpoint's total_size
    assert 2 * sum(torch.Size(s).numel() for s in specs.values()) == \
        index["metadata"]["total_size"]
    assert specs["model.embed_tokens.weight"] == (151936, 2560)
    assert specs["model.layers.0.self_attn.q_proj.weight"] == (32 * 128, 2560)
    assert specs["model.layers.0.self_attn.k_proj.weight"] == (8 * 128, 2560)
    assert specs["model.layers.0.self_attn.q_norm.weight"] == (128,)
    assert specs["model.layers.35.mlp.down_proj.weight"] == (2560, 9728)
    made = set(read_tensors(tiny_sdar))
    assert _top_and_layer0(made) == _top_and_layer0(real)
    assert len(made) == 3 + 2 * 11


def _moe_layer_names(layer: int, experts: int) -> set[str]:
    p = f"model.layers.{layer}."
    names = {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                             "mlp.gate.weight")}
    names |= {f"{p}self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                    "q_norm", "k_norm")}
    names |= {f"{p}mlp.experts.{e}.{n}_proj.weight" for e in range(experts)
              for n in ("gate", "up", "down")}
    return names


def test_moe_checkpoint_names_per_expert_tensors(tiny_sdar_moe):
    tensors = read_tensors(tiny_sdar_moe)
    want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(2):
        want |= _moe_layer_names(layer, 8)
    assert set(tensors) == want
    assert tensors["model.layers.1.mlp.gate.weight"].shape == (8, 64)
    assert tensors["model.layers.1.mlp.experts.7.gate_proj.weight"].shape == (32, 64)
    assert tensors["model.layers.1.mlp.experts.7.up_proj.weight"].shape == (32, 64)
    assert tensors["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    # loading stacks expert e into row e of the model's [E, ...] parameters: gate_proj then
    # up_proj rows in w13, down_proj in w2
    p = params(LLM(tiny_sdar_moe, dtype="float32"))
    w13, w2 = p["model.layers.1.mlp.experts.w13"], p["model.layers.1.mlp.experts.w2"]
    for e in range(8):
        t = {n: tensors[f"model.layers.1.mlp.experts.{e}.{n}_proj.weight"]
             for n in ("gate", "up", "down")}
        assert torch.equal(w13[e], torch.cat([t["gate"], t["up"]]))
        assert torch.equal(w2[e], t["down"])


@needs_real
def test_moe_names_of_real_sdar_30b_config():
    specs = meta_specs(read_config(SDAR_30B))
    want = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(48):
        want |= _moe_layer_names(layer, 128)
    assert set(specs) == want
    assert specs["model.layers.47.mlp.experts.127.down_proj.weight"] == (2048, 768)
    assert specs["model.layers.0.mlp.gate.weight"] == (128, 2048)


LLADA_BLOCK = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out",
               "attn_norm", "ff_norm")
LLADA_TOP = {"model.transformer.wte.weight", "model.transformer.ln_f.weight",
             "model.transformer.ff_out.weight"}


@needs_real
def test_llada_names_match_llada_8b(tiny_llada):
    specs = meta_specs(read_config(LLADA_8B))
    want = set(LLADA_TOP)
    for b in range(32):
        want |= {f"model.transformer.blocks.{b}.{n}.weight" for n in LLADA_BLOCK}
    assert set(specs) == want
    blk = "model.transformer.blocks.0."
    assert specs["model.transformer.wte.weight"] == (126464, 4096)
    assert specs["model.transformer.ff_out.weight"] == (126464, 4096)
    assert specs[blk + "q_proj.weight"] == (4096, 4096)
    assert specs[blk + "ff_proj.weight"] == (12288, 4096)
    assert specs[blk + "up_proj.weight"] == (12288, 4096)
    assert specs[blk + "ff_out.weight"] == (4096, 12288)
    assert specs[blk + "attn_norm.weight"] == (4096,)
    made = set(read_tensors(tiny_llada))
    assert made == LLADA_TOP | {f"model.transformer.blocks.{b}.{n}.weight"
                                for b in range(2) for n in LLADA_BLOCK}


def test_tokenizer_files_only_for_sdar(tiny_sdar, tiny_sdar_moe, tiny_llada):
    for folder in (tiny_sdar, tiny_sdar_moe):
        for n in TOKENIZER_FILES:
            assert (folder / n).read_bytes() == (data_path("sdar-qwen3") / n).read_bytes(), n
    assert not any((tiny_llada / n).exists() for n in TOKENIZER_FILES + ("tokenizer.json",))
    gen = json.loads((tiny_sdar / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    assert load_tokenizer(tiny_sdar).mask_token_id == 151669


def test_num_layers_flag_reduces_layers(tmp_path, capsys):
    out = tmp_path / "one"
    assert cli_main(["make-checkpoint", "tiny-sdar", str(out), "--num-layers", "1",
                     "--seed", "4", "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    hf = read_config(out)
    assert hf["num_hidden_layers"] == 1 and hf["torch_dtype"] == "float32"
    names = set(read_tensors(out))
    assert {n for n in names if ".layers." in n} == \
        {n for n in meta_specs(PRESETS["tiny-sdar"]) if ".layers.0." in n}
    llm = LLM(out, dtype="float32")
    assert llm.config.num_layers == 1 and len(llm.model.model.layers) == 1
    llada = make_checkpoint("tiny-llada", tmp_path / "llada1", num_layers=1)
    assert read_config(llada)["n_layers"] == 1
    assert not any("blocks.1." in n for n in read_tensors(llada))
    with pytest.raises(CheckpointError, match="num_layers=0"):
        make_checkpoint("tiny-sdar", tmp_path / "zero", num_layers=0)


@needs_real
@pytest.mark.huge
def test_reduced_copy_of_real_sdar_4b(tmp_path, request):
    """~1.5 GB in bf16 (the embeddings): only with `-m huge`."""
    if (request.config.getoption("-m") or "").strip() != "huge":
        pytest.skip("writes 1.5 GB: run with -m huge")
    out = make_checkpoint(SDAR_4B, tmp_path / "sdar4b-1", num_layers=1, seed=1)
    hf = read_config(out)
    assert hf["num_hidden_layers"] == 1 and hf["max_window_layers"] == 1
    assert hf["hidden_size"] == 2560
    assert json.loads((out / "generation_config.json").read_text()) == \
        json.loads((SDAR_4B / "generation_config.json").read_text())
    real = json.loads((SDAR_4B / INDEX_NAME).read_text())["weight_map"]
    with safe_open(out / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
        assert names == _top_and_layer0(real)
        k = f.get_tensor("model.layers.0.self_attn.k_proj.weight")
    spec = next(s for s in weight_specs(meta_model(hf))
                if s.key == "model.layers.0.self_attn.k_proj.weight")
    assert k.shape == (1024, 2560)
    assert torch.equal(k, random_tensor(spec, 1, 0.02, torch.bfloat16, "cpu"))
    llm = LLM(out, dtype="bfloat16")
    r = llm.generate([1, 2, 3], 4, temperature=0)
    assert len(r.token_ids) == 4


def _other_process_finishes_first(monkeypatch, out: Path) -> None:
    """While make_checkpoint writes, a complete `out` appears (as if made by another process)."""
    real_copy = make_mod._copy_tokenizer

    def copy_then_race(src_dir, family, dst):
        real_copy(src_dir, family, dst)
        if not out.exists():
            shutil.copytree(dst, out)
            (out / "other.marker").write_text("made by the other process")

    monkeypatch.setattr(make_mod, "_copy_tokenizer", copy_then_race)


def test_make_never_deletes_a_folder_that_appears_meanwhile(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    _other_process_finishes_first(monkeypatch, out)
    with pytest.raises(CheckpointError, match="created by someone else"):
        make_checkpoint("tiny-llada", out, num_layers=1)
    assert (out / "other.marker").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary folder left
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        make_checkpoint("tiny-llada", out, num_layers=1, overwrite=True)
    assert (out / "other.marker").is_file()
    (out / "other.marker").unlink()
    make_checkpoint("tiny-llada", out, num_layers=1, overwrite=True)
    assert read_config(out)["n_layers"] == 1


# --- the embedded default model -------------------------------------------------------------


def test_default_model_is_the_packaged_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DLRT_CACHE_DIR", str(tmp_path / "cache"))
    path = default_model_path()
    assert path == data_path("sdar-stdlib-8m") and path.is_dir()
    assert not (tmp_path / "cache").exists()  # nothing written for the default
    hf = read_config(path)
    assert hf["model_type"] == "sdar" and hf["architectures"] == ["SDARForCausalLM"]
    params = sum(t.numel() for t in load_file(path / "model.safetensors").values())
    assert params <= 8_000_000
    record = json.loads((path / "training_record.json").read_text())
    assert record["model"]["parameters"] == params
    assert (path / "README.md").is_file()  # the model card


def test_default_model_card_table_matches_the_record():
    """The model card's numbers are the ones `tools/model_card.py` writes from the record."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "model_card.py"
    spec = importlib.util.spec_from_file_location("model_card", tool)
    card_tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card_tool)
    path = default_model_path()
    card = (path / "README.md").read_text()
    record = json.loads((path / "training_record.json").read_text())
    assert card_tool.table(record) in card, f"run: python tools/model_card.py {path}"


def test_default_model_chat_template_makes_comment_lines():
    tok = load_tokenizer(default_model_path())
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Write a haiku\nabout the sea."}], tokenize=False,
        add_generation_prompt=True)
    assert text == "# Write a haiku\n# about the sea.\n"


def test_default_model_missing_is_an_error(tmp_path, monkeypatch):
    """No fallback: a missing folder or weights file is an error that names the path."""
    gone = tmp_path / "gone"
    monkeypatch.setattr(default_mod, "data_path", lambda *parts: gone)
    for call in (default_model_path, LLM):
        with pytest.raises(CheckpointError, match="installation is incomplete") as e:
            call()
        assert str(gone) in str(e.value)
    shutil.copytree(data_path("sdar-stdlib-8m"), gone,
                    ignore=shutil.ignore_patterns("model.safetensors"))
    with pytest.raises(CheckpointError, match="model.safetensors") as e:
        default_model_path()
    assert str(gone) in str(e.value) and "installation is incomplete" in str(e.value)


# --- bad folders ----------------------------------------------------------------------------


def test_folder_missing(tmp_path):
    with pytest.raises(CheckpointError, match=r"does not exist") as e:
        LLM(tmp_path / "nowhere")
    assert "nowhere" in str(e.value)


def test_no_config_json(tmp_path):
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        LLM(tmp_path)


def test_config_not_json(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    (folder / "config.json").write_text("{model_type: sdar,")
    with pytest.raises(CheckpointError, match=r"cannot read .*config\.json"):
        LLM(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"config\.json does not hold a JSON object"):
        LLM(folder)


def test_unknown_model_type(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    edit_config(folder, model_type="mamba9", architectures=["Mamba9ForCausalLM"])
    with pytest.raises(ConfigError, match=r"unknown model_type 'mamba9'"):
        LLM(folder)
    with pytest.raises(ConfigError, match="mamba9"):
        make_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # a known architecture does not excuse an unknown model_type
    edit_config(folder, model_type="gpt9", architectures=["SDARForCausalLM"])
    with pytest.raises(ConfigError, match=r"unknown model_type 'gpt9'"):
        LLM(folder)
    edit_config(folder, model_type=None, architectures=["SDARForCausalLM"])
    assert LLM(folder).config.family == "sdar"  # no model_type: read by architectures


def edit_generation_config(folder: Path, **changes) -> None:
    """Set generation_config.json fields."""
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("changes", [
    {"eos_token_id": "abc"}, {"eos_token_id": ["151645"]}, {"eos_token_id": []},
    {"eos_token_id": [151645, 10**6]}, {"eos_token_id": -1}, {"eos_token_id": True},
    {"eos_token_id": 1.0}, {"pad_token_id": "abc"}, {"pad_token_id": 151936},
    {"do_sample": "yes"}, {"do_sample": True, "temperature": -3},
    {"do_sample": True, "temperature": float("inf")}, {"temperature": "0.6"},
    {"do_sample": True, "top_k": -1}, {"do_sample": True, "top_k": 20.5}, {"top_k": "20"},
    {"do_sample": True, "top_p": 0}, {"do_sample": True, "top_p": 1.5}, {"top_p": [0.9]},
], ids=lambda c: ",".join(f"{k}={v!r}" for k, v in c.items()))
def test_bad_generation_config_values_name_the_file_field_and_value(tiny_sdar, tmp_path,
                                                                    changes):
    folder = clone(tiny_sdar, tmp_path / "c")
    edit_generation_config(folder, **changes)
    field, value = list(changes.items())[-1]
    with pytest.raises(CheckpointError) as e:
        LLM(folder, load_format="dummy")
    msg = str(e.value)
    assert str(folder / "generation_config.json") in msg, msg
    assert f"{field}={json.loads(json.dumps(value))!r}" in msg, msg


def test_generation_config_values_dlrt_reads(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    # null: unset (config.json's eos ids); sampling values unused without do_sample
    edit_generation_config(folder, eos_token_id=None, pad_token_id=None, temperature=-3,
                           top_p=0)
    llm = LLM(folder, load_format="dummy")
    assert llm.eos_token_ids == (151643,)  # config.json's
    assert llm.resolve(DecodingOptions()).sampling.temperature == 0.0
    edit_generation_config(folder, eos_token_id=7, do_sample=True, temperature=0.5, top_k=3,
                           top_p=0.9)
    llm = LLM(folder, load_format="dummy")
    assert llm.eos_token_ids == (7,)
    sampling = llm.resolve(DecodingOptions()).sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.5, 3, 0.9)


LLADA2_ATTENTION = ("query_key_value", "dense", "query_layernorm", "key_layernorm")
LLADA2_TOP = {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"}


def _llada2_layer_names(layer: int, experts: int) -> set[str]:
    """The official tensor names of one LLaDA2 layer: dense (experts=0) or MoE."""
    p = f"model.layers.{layer}."
    names = {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
    names |= {f"{p}attention.{n}.weight" for n in LLADA2_ATTENTION}
    mlps = ["mlp"] if not experts else \
        ["mlp.shared_experts", *(f"mlp.experts.{e}" for e in range(experts))]
    names |= {f"{p}{m}.{n}_proj.weight" for m in mlps for n in ("gate", "up", "down")}
    if experts:
        names |= {p + "mlp.gate.weight", p + "mlp.gate.expert_bias"}
    return names


def test_llada2_checkpoint_names(tmp_path):
    out = make_checkpoint("tiny-llada2", tmp_path / "c")
    tensors = read_tensors(out)
    assert set(tensors) == LLADA2_TOP | _llada2_layer_names(0, 0) | \
        _llada2_layer_names(1, 8) | _llada2_layer_names(2, 8)
    assert tensors["model.layers.0.attention.query_key_value.weight"].shape == (8 * 32, 64)
    assert tensors["model.layers.0.attention.dense.weight"].shape == (64, 4 * 32)
    assert tensors["model.layers.0.attention.query_layernorm.weight"].shape == (32,)
    assert tensors["model.layers.0.mlp.gate_proj.weight"].shape == (128, 64)
    assert tensors["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    assert tensors["model.layers.1.mlp.shared_experts.up_proj.weight"].shape == (32, 64)
    assert tensors["model.layers.2.mlp.gate.weight"].dtype == torch.bfloat16
    bias = tensors["model.layers.2.mlp.gate.expert_bias"]
    assert bias.shape == (8,) and bias.dtype == torch.float32 and bias.std() > 0


@needs_real
def test_llada2_names_of_real_llada2_mini_config(tmp_path):
    specs = meta_specs(read_config(LLADA2))
    want = LLADA2_TOP | _llada2_layer_names(0, 0)
    for layer in range(1, 20):
        want |= _llada2_layer_names(layer, 256)
    assert set(specs) == want
    assert specs["model.word_embeddings.weight"] == (157184, 2048)
    assert specs["lm_head.weight"] == (157184, 2048)
    assert specs["model.layers.0.attention.query_key_value.weight"] == ((16 + 2 * 4) * 128, 2048)
    assert specs["model.layers.0.attention.dense.weight"] == (2048, 16 * 128)
    assert specs["model.layers.0.attention.key_layernorm.weight"] == (128,)
    assert specs["model.layers.0.mlp.up_proj.weight"] == (5120, 2048)
    assert specs["model.layers.19.mlp.gate.weight"] == (256, 2048)
    assert specs["model.layers.19.mlp.gate.expert_bias"] == (256,)
    assert specs["model.layers.19.mlp.experts.255.down_proj.weight"] == (2048, 512)
    assert specs["model.layers.1.mlp.shared_experts.gate_proj.weight"] == (512, 2048)
    with pytest.raises(CheckpointError, match="num_layers=21"):
        make_checkpoint("LLaDA2.0-mini", tmp_path / "x", num_layers=21)


@needs_real
@pytest.mark.huge
def test_reduced_copy_of_real_llada2_mini(tmp_path, request, capsys):
    """`dlrt make-checkpoint LLaDA2.0-mini OUT --num-layers 2`: the dense layer and one MoE
    layer of 256 experts, ~2.9 GB in bf16: only with `-m huge`. The shipped config names no
    mask or eos token and the copy has no tokenizer: the family's defaults apply."""
    if (request.config.getoption("-m") or "").strip() != "huge":
        pytest.skip("writes 2.9 GB: run with -m huge")
    out = tmp_path / "llada2-2"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert cli_main(["make-checkpoint", "LLaDA2.0-mini", str(out), "--num-layers", "2",
                     "--seed", "1", "--device", device]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    hf = read_config(out)
    assert hf["num_hidden_layers"] == 2 and hf["max_window_layers"] == 2
    tensors = read_tensors(out)
    assert set(tensors) == LLADA2_TOP | _llada2_layer_names(0, 0) | _llada2_layer_names(1, 256)
    assert tensors["model.layers.1.mlp.gate.expert_bias"].dtype == torch.float32
    assert tensors["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16
    llm = LLM(out, dtype="bfloat16", device=device)
    assert llm.config.mask_token_id == 156895 and llm.eos_token_ids == (156892,)
    r = llm.generate([1, 2, 3], 8, temperature=0, block_length=4)
    assert len(r.token_ids) == 8


class _Bait:
    """Unpickling this creates `marker`: proof that a pickle was (not) loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_pytorch_bin_only_is_refused_unloaded(tiny_sdar, tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    shutil.copyfile(tiny_sdar / "config.json", folder / "config.json")
    marker = tmp_path / "unpickled"
    (folder / "pytorch_model.bin").write_bytes(
        pickle.dumps({"model.embed_tokens.weight": _Bait(marker)}))
    with pytest.raises(CheckpointError, match=r"safetensors") as e:
        LLM(folder)
    assert "pytorch_model.bin" in str(e.value)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="safetensors"):
        LLM(folder, load_format="safetensors")
    assert not marker.exists()
    pickle.loads((folder / "pytorch_model.bin").read_bytes())  # the bait works
    assert marker.is_dir()


def test_index_names_missing_shard(sharded, tmp_path):
    folder = clone(sharded, tmp_path / "c")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"names model-00002-of-00003\.safetensors"):
        LLM(folder)


@needs_real
def test_truncated_shard_names_the_file(sharded, tmp_path):
    folder = clone(sharded, tmp_path / "c")
    shard = folder / "model-00002-of-00003.safetensors"
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model-00002-of-00003\.safetensors"):
        LLM(folder)


@pytest.mark.parametrize("where", ["../outside.safetensors", "sub/../../outside.safetensors",
                                   "absolute"])
def test_index_entry_outside_the_folder(sharded, tmp_path, where):
    folder = clone(sharded, tmp_path / "c")
    outside = tmp_path / "outside.safetensors"
    shutil.copyfile(sharded / "model-00001-of-00003.safetensors", outside)
    fname = str(outside) if where == "absolute" else where
    index = json.loads((folder / INDEX_NAME).read_text())
    key = next(k for k, v in index["weight_map"].items() if v.startswith("model-00001"))
    index["weight_map"][key] = fname
    (folder / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="not a file inside") as e:
        LLM(folder)
    assert repr(fname) in str(e.value)


@pytest.mark.parametrize("name, text", [("tokenizer_config.json", "{not json"),
                                        ("vocab.json", "garbage[")])
def test_corrupt_tokenizer_file(tiny_sdar, tmp_path, name, text):
    folder = clone(tiny_sdar, tmp_path / "c")
    (folder / name).write_text(text)
    with pytest.raises(CheckpointError, match="cannot load the tokenizer") as e:
        LLM(folder)
    assert str(folder) in str(e.value)


@pytest.mark.parametrize("model, words", [("", "empty"), ("  ", "empty"), (5, "5 (int)"),
                                          (["a"], "['a'] (list)")])
def test_model_argument_not_a_path(model, words):
    with pytest.raises(OptionError, match="model") as e:
        LLM(model)
    assert words in str(e.value)


@needs_real
def test_real_index_without_weights(tmp_path):
    with pytest.raises(CheckpointError, match=r"model-00001-of-00002\.safetensors"):
        LLM(SDAR_4B)


def test_not_a_safetensors_file(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        LLM(folder)


def test_missing_tensor(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    rewrite_weights(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"lacks tensor.*model\.layers\.1\.mlp\.up_proj"):
        LLM(folder)


def test_missing_expert_tensor(tiny_sdar_moe, tmp_path):
    folder = clone(tiny_sdar_moe, tmp_path / "c")
    rewrite_weights(folder, lambda t: t.pop("model.layers.1.mlp.experts.5.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.experts\.5\.down_proj"):
        LLM(folder)


def test_integer_tensor_for_a_float_weight(tiny_sdar_moe, tmp_path):
    folder = clone(tiny_sdar_moe, tmp_path / "c")
    key = "model.layers.1.mlp.experts.3.up_proj.weight"

    def to_int(t):
        t[key] = t[key].to(torch.int32)

    rewrite_weights(folder, to_int)
    with pytest.raises(CheckpointError, match=rf"{re.escape(key)}.*int32.*floating-point"):
        LLM(folder)


def test_make_names_what_it_knows_for_an_unknown_source(tmp_path):
    with pytest.raises(CheckpointError, match=r"no such folder.*tiny-llada2.*LLaDA2\.0-mini"):
        make_checkpoint("tiny-bogus", tmp_path / "x")


def test_misshaped_tensor(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    key = "model.layers.0.self_attn.q_proj.weight"

    def shrink(t):
        t[key] = t[key][:, :32].contiguous()

    rewrite_weights(folder, shrink)
    with pytest.raises(CheckpointError) as e:
        LLM(folder)
    msg = str(e.value)
    assert key in msg and "[64, 32]" in msg and "[64, 64]" in msg


def test_mask_token_from_config_tokenizer_or_option(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    edit_config(folder, mask_token_id=None)
    assert LLM(folder, load_format="dummy").config.mask_token_id == 151669  # the tokenizer's
    for n in TOKENIZER_FILES:
        (folder / n).unlink()
    with pytest.raises(ConfigError, match=r"no mask_token_id.*mask_token_id=") as e:
        LLM(folder)
    assert str(folder) in str(e.value)
    llm = LLM(folder, mask_token_id=151660)
    assert llm.config.mask_token_id == 151660
    with pytest.raises(OptionError, match="mask_token_id=151936"):
        LLM(folder, mask_token_id=151936)


@pytest.mark.parametrize("kw,field", [
    ({"dtype": "int8"}, "dtype 'int8'"),
    ({"device": "tpu"}, "device 'tpu'"),
    ({"load_format": "pickle"}, "load_format 'pickle'"),
    ({"decoder": "nope"}, "decoder 'nope'"),
    ({"decoder": "dllm_var"}, "decoder 'dllm_var' does not fit a sdar model"),
    ({"max_model_len": 0}, "max_model_len=0"),
])
def test_bad_llm_options(tiny_sdar, kw, field):
    with pytest.raises(OptionError) as e:
        LLM(tiny_sdar, **kw)
    assert field in str(e.value)
    assert isinstance(e.value, ValueError)


def test_auto_map_never_runs_code(tiny_sdar, tmp_path):
    folder = clone(tiny_sdar, tmp_path / "c")
    marker = tmp_path / "remote-code-ran"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text(__name__)\n"
    for mod in ("configuration_evil", "modeling_evil", "tokenization_evil"):
        (folder / f"{mod}.py").write_text(code + "class Evil:\n    pass\n")
    edit_config(folder, auto_map={
        "AutoConfig": "configuration_evil.Evil", "AutoModel": "modeling_evil.Evil",
        "AutoModelForCausalLM": "modeling_evil.Evil",
        "AutoTokenizer": ["tokenization_evil.Evil", None]})
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tok_cfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.Evil", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    llm = LLM(folder, dtype="float32")
    assert type(llm.tokenizer).__name__.startswith("Qwen2Tokenizer")
    assert llm.encode("hello") == load_tokenizer(data_path("sdar-qwen3")).encode("hello")
    assert len(llm.generate("hello", 2, temperature=0).token_ids) == 2
    assert not marker.exists()
    import importlib.util  # the bait works when imported

    spec = importlib.util.spec_from_file_location("modeling_evil", folder / "modeling_evil.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert marker.read_text() == "modeling_evil"


def test_make_refuses_existing_out_and_bad_dtype(tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(CheckpointError, match=r"exists.*overwrite"):
        make_checkpoint("tiny-llada", out)
    assert (out / "keep").is_file()
    with pytest.raises(CheckpointError, match=r"dtype 'int4'"):
        make_checkpoint("tiny-llada", tmp_path / "x", dtype="int4")
    made = make_checkpoint("tiny-llada", tmp_path / "made", num_layers=1)
    made = make_checkpoint("tiny-llada", made, overwrite=True)
    assert read_config(made)["n_layers"] == 2


def test_overwrite_replaces_only_checkpoint_folders(tmp_path, capsys):
    sdar = make_checkpoint("tiny-sdar", tmp_path / "sdar", max_shard_bytes=SHARD_BYTES)
    assert (sdar / INDEX_NAME).is_file() and (sdar / "vocab.json").is_file()
    make_checkpoint("tiny-sdar", sdar, num_layers=1, overwrite=True)
    assert read_config(sdar)["num_hidden_layers"] == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_config(make_checkpoint("tiny-llada", empty, overwrite=True))["n_layers"] == 2
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text("{}")
    (home / "thesis.tex").write_text("years of work")
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_text("no config.json")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in (home, other, a_file):
        with pytest.raises(CheckpointError, match="not a checkpoint folder") as e:
            make_checkpoint("tiny-llada", out, overwrite=True)
        assert str(out) in str(e.value)
    assert (home / "thesis.tex").is_file() and (other / "model.safetensors").is_file()
    assert a_file.read_text() == "x"
    assert cli_main(["make-checkpoint", "tiny-llada", str(home), "--overwrite"]) == 2
    assert f"error: {home}" in capsys.readouterr().err
    assert (home / "thesis.tex").is_file()


def test_make_output_path_errors(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    outs = [a_file / "ckpt", a_file / "deeper" / "ckpt", Path("/proc/dlrt-ckpt")]
    if os.geteuid() != 0:  # NOTE: root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        outs.append(locked / "ckpt")
    for out in outs:
        with pytest.raises(CheckpointError, match="cannot write the checkpoint") as e:
            make_checkpoint("tiny-llada", out, num_layers=1)
        assert str(out) in str(e.value)
    assert cli_main(["make-checkpoint", "tiny-llada", str(a_file / "ckpt")]) == 2
    assert "error: cannot write the checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("device, words", [
    ("bogus", "not a valid device"),
    ("meta", "cpu or cuda"),
    pytest.param("cuda", "CUDA is not available", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="CUDA is available")),
])
def test_make_bad_device(tmp_path, device, words):
    with pytest.raises(CheckpointError, match=words) as e:
        make_checkpoint("tiny-llada", tmp_path / "out", device=device)
    assert repr(device) in str(e.value)
    assert not list(tmp_path.iterdir())


def test_num_layers_above_the_config(tmp_path):
    with pytest.raises(CheckpointError, match=r"num_layers=3 must be in \[1, 2\].*this many"):
        make_checkpoint("tiny-llada", tmp_path / "three", num_layers=3)
    assert not (tmp_path / "three").exists()


def test_make_checkpoint_from_a_shipped_real_config_name(tmp_path):
    """`make-checkpoint SDAR-8B-Chat OUT` finds the shipped real config (reduced to 1 layer)."""
    from dlrt.checkpoint.folder import CheckpointFolder
    from dlrt.checkpoint.make import make_checkpoint

    out = make_checkpoint("SDAR-1.7B-Chat", tmp_path / "c", num_layers=1, dtype="bfloat16")
    cfg = CheckpointFolder.open(out).hf_config
    real = json.loads((MODELS / "SDAR-1.7B-Chat" / "config.json").read_text())
    assert cfg["hidden_size"] == real["hidden_size"] == 2048
    assert cfg["num_hidden_layers"] == 1 and real["num_hidden_layers"] == 28
    assert (out / "vocab.json").is_file()


def test_made_checkpoint_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out = make_checkpoint("tiny-sdar", tmp_path / "ck")
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o755
    assert all((f.stat().st_mode & 0o777) == 0o644 for f in out.iterdir())
