"""DiffusionGemma's config normaliser, family record and what it refuses: the shipped real config,
a config as `save_pretrained` writes it (`per_layer_config`), the reference's defaults, bad
fields named, image input, tensor parallelism, `LLM` with a mask-token decoder; what
make-checkpoint writes (the tiny preset's tokenizer, a config folder's eos ids); other families'
configs unchanged; bad checkpoints named; seeded dummy weights equal a made checkpoint's."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.loader import init_dummy, load_safetensors, materialize, weight_specs
from dlrt.checkpoint.make import make_checkpoint
from dlrt.checkpoint.presets import PRESETS, preset, real_config
from dlrt.distributed.transform import check_sizes
from dlrt.errors import CheckpointError, ConfigError, OptionError, PromptError
from dlrt.llm import LLM
from dlrt.models.config import FULL, SLIDING
from dlrt.models.diffusion_gemma.config import with_layers
from dlrt.models.diffusion_gemma.prompt import check_text_only
from dlrt.models.registry import build_model, family_of, model_config
from dlrt.ops import reference

TINY = "tiny-diffusion-gemma"


def _real() -> dict:
    return json.loads((real_config("DiffusionGemma-26B-A4B-it") / "config.json").read_text())


def _tiny(**text_changes) -> dict:
    hf = copy.deepcopy(PRESETS[TINY])
    hf["text_config"].update(text_changes)
    return hf


def test_the_real_config():
    c = model_config(_real())
    assert family_of(_real()).name == c.family == "diffusion_gemma"
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads) == (262144, 2816, 30, 16)
    assert c.layer_types == tuple(FULL if i % 6 == 5 else SLIDING for i in range(30))
    assert c.kv_shapes()[:6] == ((8, 256),) * 5 + ((2, 512),)
    assert (c.sliding_window, c.layer_window(0), c.layer_window(5)) == (1024, 1024, None)
    assert c.attention_k_eq_v and c.attention_scale == 1.0
    assert (c.rope_theta, c.global_rope_theta, c.global_rope_pairs) == (1e4, 1e6, 64)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 8, 704)
    assert c.intermediate_size == 2112 and c.hidden_act == "gelu_pytorch_tanh"
    assert (c.final_logit_softcapping, c.canvas_length, c.eos_token_ids) == (30.0, 256, (1, 106))
    assert c.embed_scale == 2816**0.5 and c.tie_word_embeddings and c.mask_token_id is None
    assert c.attention_needs() == ("sliding_window", "layer_shapes", "chunk_kv")


def test_the_real_model_on_the_meta_device():
    config = model_config(_real())
    with torch.device("meta"):
        model = build_model(config, reference.OPS)
    specs = {s.key: s.shape for s in weight_specs(model)}
    assert sum(torch.Size(s).numel() for s in specs.values()) == 25_250_986_812
    layer = "model.decoder.layers.5."
    assert f"{layer}self_attn.k_proj.weight" in specs  # full attention: K = V, no v_proj
    assert f"{layer}self_attn.v_proj.weight" not in specs
    assert specs[f"{layer}self_attn.q_proj.weight"] == (16 * 512, 2816)
    assert specs["model.decoder.layers.0.self_attn.v_proj.weight"] == (8 * 256, 2816)
    assert specs[f"{layer}experts.gate_up_proj"] == (128, 2 * 704, 2816)
    assert specs["model.encoder.language_model.layers.29.layer_scalar"] == (1,)
    assert "lm_head.weight" not in specs  # tied to model.decoder.embed_tokens


def test_a_saved_config_reads_as_written():
    """`save_pretrained` drops global_head_dim / num_global_key_value_heads for the resolved
    `per_layer_config` (layer index -> overrides); both forms give the same config."""
    saved = _tiny()
    t = saved["text_config"]
    dim, kv = t.pop("global_head_dim"), t.pop("num_global_key_value_heads")
    t["per_layer_config"] = {str(i): {"head_dim": dim, "num_key_value_heads": kv}
                             for i in (1, 3)}
    assert model_config(saved) == model_config(PRESETS[TINY])


def test_absent_fields_take_the_references_defaults():
    hf = {"model_type": "diffusion_gemma",
          "text_config": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8}}
    c = model_config(hf)
    assert c.layer_types == tuple(FULL if i % 6 == 5 else SLIDING for i in range(30))
    assert (c.sliding_window, c.head_dim, c.global_head_dim, c.num_global_kv_heads) == \
        (512, 256, 512, 4)
    assert (c.global_rope_pairs, c.global_rope_theta, c.rope_theta) == (64, 1e6, 1e4)
    assert (c.final_logit_softcapping, c.canvas_length, c.eos_token_ids) == (30.0, 256, (1,))
    assert c.image_token_id == 258880
    reference = pytest.importorskip("transformers.models.diffusion_gemma")
    ref = reference.DiffusionGemmaTextConfig(**hf["text_config"])
    assert list(c.layer_types) == ref.layer_types and c.sliding_window == ref.sliding_window
    assert c.num_kv_heads == ref.num_key_value_heads and c.vocab_size == ref.vocab_size
    assert (c.global_head_dim, c.num_global_kv_heads) == \
        (ref.per_layer_config[5].head_dim, ref.per_layer_config[5].num_key_value_heads)


def test_the_last_layer_is_full_attention():
    c = model_config(_tiny(layer_types=[SLIDING] * 4))
    assert c.layer_types == (SLIDING, SLIDING, SLIDING, FULL)
    assert c.kv_shapes()[-1] == (1, 32)


@pytest.mark.parametrize("change,words", [
    (dict(layer_types=[SLIDING] * 3), "text_config.layer_types"),
    (dict(layer_types=[SLIDING, "local", SLIDING, FULL]), "text_config.layer_types"),
    (dict(per_layer_config={"1": {"head_dim": 32}, "3": {"head_dim": 64}}),
     "text_config.per_layer_config"),
    (dict(per_layer_config={"0": {"head_dim": 32}}), "text_config.per_layer_config.0"),
    (dict(per_layer_config={"1": {"sliding_window": 4}}), "text_config.per_layer_config.1"),
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention='all'"),
    (dict(rope_parameters={FULL: {"rope_type": "yarn", "rope_theta": 1e6},
                           SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
     "text_config.rope_parameters.full_attention.rope_type='yarn'"),
    (dict(rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1e6}}),
     "lacks text_config.rope_parameters.sliding_attention"),
    (dict(rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1e6},
                           SLIDING: {"rope_type": "default", "rope_theta": 1e4,
                                     "partial_rotary_factor": 0.5}}),
     "text_config.rope_parameters.sliding_attention.partial_rotary_factor=0.5"),
    (dict(rope_parameters={FULL: {"rope_type": "proportional", "rope_theta": 1e6,
                                  "factor": 8.0},
                           SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
     "text_config.rope_parameters.full_attention.factor=8.0"),
    (dict(rope_parameters={FULL: {"rope_type": "default"},
                           SLIDING: {"rope_type": "default", "rope_theta": 1e4}}),
     "text_config.rope_parameters.full_attention.rope_theta=None"),
    (dict(tie_word_embeddings=False), "text_config.tie_word_embeddings=false"),
    (dict(num_experts=None), "lacks required field 'text_config.num_experts'"),
    (dict(top_k_experts=8), "text_config.top_k_experts=8 exceeds num_experts=4"),
    (dict(hidden_activation="relu"), "text_config.hidden_activation='relu'"),
    (dict(num_global_key_value_heads=3), "num_global_key_value_heads=3 must divide"),
    (dict(num_key_value_heads=3), "text_config.num_key_value_heads=3 must divide"),
    (dict(attention_bias=True), "text_config.attention_bias=true"),
    (dict(attention_k_eq_v="yes"), "text_config.attention_k_eq_v='yes' must be true or false"),
    (dict(head_dim=0), "text_config.head_dim=0"),
    (dict(sliding_window=-1), "text_config.sliding_window=-1"),
])
def test_bad_fields_are_named(change, words):
    with pytest.raises(ConfigError, match=None) as err:
        model_config(_tiny(**change))
    assert words in str(err.value)


def test_a_config_without_its_text_model():
    vision_only = {k: v for k, v in PRESETS[TINY].items() if k != "text_config"}
    with pytest.raises(ConfigError, match="no text_config.*vision-only config is not served"):
        model_config(vision_only)
    with pytest.raises(ConfigError, match="^tie_word_embeddings=false"):
        model_config(dict(PRESETS[TINY], tie_word_embeddings=False))
    with pytest.raises(ConfigError, match="canvas_length=0"):
        model_config(dict(PRESETS[TINY], canvas_length=0))


def test_fewer_layers():
    reduced = with_layers(_real(), 3)
    c = model_config(reduced)
    assert c.num_layers == 3 and c.layer_types == (SLIDING, SLIDING, FULL)
    saved = _tiny()
    t = saved["text_config"]
    dim, kv = t.pop("global_head_dim"), t.pop("num_global_key_value_heads")
    t["per_layer_config"] = {str(i): {"head_dim": dim, "num_key_value_heads": kv}
                             for i in (1, 3)}
    c = model_config(with_layers(saved, 3))  # the new last layer is full, of the full shape
    assert c.layer_types == (SLIDING, FULL, FULL) and c.kv_shapes()[2] == (1, 32)


def test_other_families_have_one_kind_of_layer():
    for name in ("tiny-sdar", "tiny-llada2"):
        c = model_config(PRESETS[name])
        assert c.layer_types == () and c.attention_needs() == ()
        assert c.kv_shapes() == ((c.num_kv_heads, c.head_dim),) * c.num_layers
        assert not c.is_sliding(0) and c.layer_window(0) is None and c.attention_scale is None


def test_image_input_is_refused():
    c = model_config(PRESETS[TINY])
    check_text_only(c, [2, 5, 9])
    with pytest.raises(PromptError, match=r"image input \(image_token_id 1 at position\(s\) "
                                          r"\[1, 3\]\).*not served yet \(text only\)"):
        check_text_only(c, [2, 1, 9, 1])


def test_what_is_not_served_yet_is_named():
    c = model_config(PRESETS[TINY])
    check_sizes(c, 1)
    with pytest.raises(ConfigError, match="tensor_parallel_size 2: .*sliding_window, "
                                          "layer_shapes"):
        check_sizes(c, 2)


@pytest.mark.parametrize("options, error", [
    ({"mask_token_id": 3}, r"^mask_token_id=3: diffusion_gemma models have no mask token"),
    ({"decoder": "canvas"}, r"^decoder 'canvas' does not fit a diffusion_gemma model: .*; "
                            r"use one of \['renoise'\]$"),
    ({"decoder": "block", "mask_token_id": 3}, r"^decoder 'block' does not fit"),
    ({"decoder": "dllm_var"}, r"^decoder 'dllm_var' does not fit")])
def test_no_mask_token_decoder_runs_it(tmp_path, options, error):
    """Only its renoising decoder runs it: `LLM` refuses a mask-token decoder or a mask token
    by name instead of decoding it with mask tokens."""
    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32")
    with pytest.raises(OptionError, match=error):
        LLM(str(path), device="cpu", **options)


SCALAR = "model.encoder.language_model.layers.0.layer_scalar"
EXPERTS = "model.decoder.layers.1.experts.gate_up_proj"


@pytest.mark.parametrize("drop,put,error", [
    ([SCALAR], {}, rf"lacks tensor\(s\) \['{SCALAR}'\]$"),
    (["model.decoder.layers.2.router.per_expert_scale", "model.decoder.layers.3.router.scale"],
     {}, r"lacks tensor\(s\) \['model\.decoder\.layers\.2\.router\.per_expert_scale', "
         r"'model\.decoder\.layers\.3\.router\.scale'\]$"),
    (["model.decoder.self_conditioning.pre_norm.weight"], {},
     r"lacks tensor\(s\) \['model\.decoder\.self_conditioning\.pre_norm\.weight'\]$"),
    ([], {EXPERTS: torch.zeros(4, 62, 64)},
     rf"{EXPERTS} in model\.safetensors has shape \[4, 62, 64\], the model expects "
     r"\[4, 64, 64\]"),
])
def test_bad_checkpoints_are_named(tmp_path, drop, put, error):
    """A missing encoder layer scalar, router scale or self-conditioning weight, or stacked
    experts of the wrong shape: CheckpointError naming the tensor (and no quantisation hint:
    the checkpoint is not quantised)."""
    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32")
    tensors = load_file(path / "model.safetensors")
    for key in drop:
        del tensors[key]
    save_file({**tensors, **put}, str(path / "model.safetensors"), metadata={"format": "pt"})
    with torch.device("meta"):
        model = build_model(model_config(json.loads((path / "config.json").read_text())),
                            reference.OPS)
    materialize(model, torch.float32, torch.device("cpu"))
    with pytest.raises(CheckpointError, match=error):
        load_safetensors(model, CheckpointFolder.open(path))


def test_dummy_weights_are_the_made_checkpoints(tmp_path):
    """`--load-format dummy` fills the model with what make-checkpoint writes (seeded per
    tensor), stacked experts and tied embeddings included."""
    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32", seed=5)
    assert json.loads((path / "generation_config.json").read_text()) == preset(TINY)[1]
    config = model_config(json.loads((path / "config.json").read_text()))
    models = []
    for dummy in (False, True):
        with torch.device("meta"):
            model = build_model(config, reference.OPS)
        materialize(model, torch.float32, torch.device("cpu"))
        init_dummy(model, 5, config.initializer_range) if dummy else \
            load_safetensors(model, CheckpointFolder.open(path))
        models.append(model)
    a, b = (dict(m.named_parameters()) for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert models[1].lm_head.weight is models[1].model.decoder.embed_tokens.weight


def test_the_tiny_preset_carries_a_working_tokenizer(tmp_path):
    """tiny-diffusion-gemma gets the embedded default model's tokenizer, its vocabulary and
    ids sized to it: <|endoftext|> the eos id, <|pad|> the pad id, <|mask|> the image
    placeholder (a renoising model has no mask token)."""
    from dlrt.tokenizer import load_tokenizer

    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32")
    tok = load_tokenizer(path)
    c = model_config(json.loads((path / "config.json").read_text()))
    assert tok is not None and len(tok) == c.vocab_size == 8192
    gen = json.loads((path / "generation_config.json").read_text())
    assert tok.convert_ids_to_tokens(gen["eos_token_id"]) == ["<|endoftext|>"] and \
        list(c.eos_token_ids) == gen["eos_token_id"]
    assert tok.convert_ids_to_tokens([gen["pad_token_id"], c.image_token_id]) == \
        ["<|pad|>", "<|mask|>"]
    assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"


def test_a_config_folder_gets_its_text_configs_eos_ids_and_no_tokenizer(tmp_path):
    """The shipped real config (no generation_config.json, eos ids under text_config) and any
    such folder: make-checkpoint writes those eos ids and no tokenizer (it has none)."""
    from dlrt.checkpoint.make import _source

    hf, gen, folder = _source("DiffusionGemma-26B-A4B-it")
    assert gen == {"eos_token_id": [1, 106]} and hf["text_config"]["eos_token_id"] == [1, 106]
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(PRESETS[TINY]))
    out = make_checkpoint(src, tmp_path / "out", dtype="float32")
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": [0]}
    assert not [p.name for p in out.iterdir() if p.name.startswith("tokenizer")]


@pytest.mark.parametrize("text_changes, top, words", [
    (dict(layer_types=[SLIDING, FULL, SLIDING]), {},
     "config.json: text_config.layer_types=['sliding_attention', 'full_attention', "
     "'sliding_attention'] must list 4 of"),
    (dict(num_hidden_layers=5), {}, "text_config.layer_types="),
    (dict(sliding_window="8"), {}, "text_config.sliding_window='8' must be an integer"),
    ({}, dict(canvas_length=16.5), "config.json: canvas_length=16.5 must be an integer"),
])
def test_a_bad_config_is_named_before_the_tokenizer_reads_it(tmp_path, text_changes, top,
                                                              words):
    """transformers' AutoTokenizer validates a config.json whose model_type it knows; dlrt
    reads it first, so the error names the field in one line (not a multi-line message
    that blames the tokenizer)."""
    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32")
    hf = json.loads((path / "config.json").read_text())
    hf["text_config"].update(text_changes)
    hf.update(top)
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as err:
        LLM(str(path), device="cpu")
    message = str(err.value)
    assert message.startswith(f"{path}: ") and words in message and "\n" not in message
    assert "tokenizer" not in message


def test_a_tokenizer_error_is_one_line(tmp_path):
    """A config.json that dlrt reads (sliding_window null: the reference's default) but that
    transformers refuses while loading the tokenizer: one line naming the field."""
    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32")
    hf = json.loads((path / "config.json").read_text())
    hf["text_config"]["sliding_window"] = None
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="cannot load the tokenizer") as err:
        LLM(str(path), device="cpu")
    assert "sliding_window" in str(err.value) and "\n" not in str(err.value)



def test_a_canvas_longer_than_the_context_is_refused_at_load(tmp_path):
    """A request needs a prompt token and a whole canvas: a config whose canvas does not fit
    its context, or a max_model_len below canvas_length + 1, would refuse every request, so
    they are refused when the model opens, naming the field and the option."""
    with pytest.raises(ConfigError, match=r"^config\.json: canvas_length=4096 must be below "
                                          r"text_config\.max_position_embeddings=4096"):
        model_config(dict(PRESETS[TINY], canvas_length=4096))
    assert model_config(dict(PRESETS[TINY], canvas_length=4095)).canvas_length == 4095
    path = make_checkpoint(TINY, tmp_path / "ckpt", dtype="float32")
    with pytest.raises(OptionError, match=r"^max_model_len=16 leaves no room for a canvas: a "
                                          r"request needs a prompt token and canvas_length=16 "
                                          r"positions; set it to at least 17$"):
        LLM(str(path), device="cpu", max_model_len=16)
    assert LLM(str(path), device="cpu", max_model_len=17).generate(
        [5], max_new_tokens=16, max_denoising_steps=1).finish_reason == "length"
