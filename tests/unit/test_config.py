"""`model_config` (each family's normaliser): every field of a bad type or value is a
ConfigError naming the field and the value."""

from __future__ import annotations

import pytest

from dlrt.checkpoint.presets import PRESETS
from dlrt.errors import ConfigError
from dlrt.models.registry import model_config


def config(preset: str, **changes) -> dict:
    return {**PRESETS[preset], **changes}


@pytest.mark.parametrize("preset, key, value", [
    ("tiny-sdar", "hidden_size", "64"),
    ("tiny-sdar", "hidden_size", 0),
    ("tiny-sdar", "intermediate_size", -128),
    ("tiny-sdar", "num_hidden_layers", 2.0),
    ("tiny-sdar", "num_hidden_layers", True),
    ("tiny-sdar", "num_attention_heads", "4"),
    ("tiny-sdar", "num_key_value_heads", 3),
    ("tiny-sdar", "num_key_value_heads", 0),
    ("tiny-sdar", "head_dim", 0),
    ("tiny-sdar", "vocab_size", 0),
    ("tiny-sdar", "vocab_size", -1),
    ("tiny-sdar", "rms_norm_eps", None),
    ("tiny-sdar", "rms_norm_eps", "1e-6"),
    ("tiny-sdar", "rms_norm_eps", 0.0),
    ("tiny-sdar", "rope_theta", None),
    ("tiny-sdar", "rope_theta", float("inf")),
    ("tiny-sdar", "max_position_embeddings", "32k"),
    ("tiny-sdar", "hidden_act", "gelu"),
    ("tiny-sdar", "block_size", 0),
    ("tiny-sdar", "block_size", "4"),
    ("tiny-sdar", "mask_token_id", 151936),
    ("tiny-sdar", "mask_token_id", -1),
    ("tiny-sdar", "mask_token_id", "151669"),
    ("tiny-sdar", "eos_token_id", "151643"),
    ("tiny-sdar", "tie_word_embeddings", "false"),
    ("tiny-sdar-moe", "num_experts", "8"),
    ("tiny-sdar-moe", "num_experts_per_tok", 9),
    ("tiny-sdar-moe", "decoder_sparse_step", 0),
    ("tiny-llada", "d_model", "64"),
    ("tiny-llada", "n_kv_heads", 3),
    ("tiny-llada", "embedding_size", 0),
    ("tiny-llada", "rope_theta", None),
    ("tiny-llada", "activation_type", "gelu"),
    ("tiny-llada", "mask_token_id", 126464),
])
def test_bad_field_names_field_and_value(preset, key, value):
    with pytest.raises(ConfigError) as e:
        model_config(config(preset, **{key: value}))
    msg = str(e.value)
    assert key in msg and repr(value) in msg, msg


def test_heads_not_a_multiple_of_kv_heads():
    with pytest.raises(ConfigError, match=r"num_key_value_heads=3 must divide .*\(4\)"):
        model_config(config("tiny-sdar", num_key_value_heads=3))


def test_each_eos_id_must_be_an_int():
    with pytest.raises(ConfigError, match=r"eos_token_id='2'"):
        model_config(config("tiny-sdar", eos_token_id=[151643, "2"]))


def test_null_optional_fields_take_their_defaults():
    cfg = model_config(config("tiny-sdar", num_key_value_heads=None, head_dim=None,
                                     block_size=None, mask_token_id=None, eos_token_id=None))
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.block_size) == (4, 16, None)
    assert cfg.mask_token_id is None and cfg.eos_token_ids == ()
    cfg = model_config(config("tiny-sdar", rope_theta=1000000, eos_token_id=[1, 2]))
    assert cfg.rope_theta == 1e6 and isinstance(cfg.rope_theta, float)
    assert cfg.eos_token_ids == (1, 2)
