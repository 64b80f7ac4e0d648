"""LLaDA's `config.json` (OLMo names: `d_model`, `n_heads`, ...) -> `ModelConfig`."""

from __future__ import annotations

from typing import Any

from dlrt.errors import ConfigError
from dlrt.models import hf as f
from dlrt.models.config import ModelConfig


def llada_config(hf: dict[str, Any], family: str = "llada") -> ModelConfig:
    """Normalise a LLaDA config (block_type "llama", RoPE, no biases).

    Raises:
        ConfigError: a missing required field, a field of the wrong type or out of range, or
            an unsupported feature (alibi, another block type, biases, no rope, not silu).
    """
    if hf.get("alibi"):
        raise ConfigError("LLaDA with alibi=true is not supported")
    if hf.get("block_type", "llama") != "llama":
        raise ConfigError(f"LLaDA block_type {hf.get('block_type')!r} is not supported")
    if hf.get("include_bias") or hf.get("include_qkv_bias"):
        raise ConfigError("LLaDA with biases is not supported")
    if not hf.get("rope", True):
        raise ConfigError("LLaDA without rope is not supported")
    f.activation("activation_type", hf.get("activation_type", "silu"))
    d_model = f.as_int("d_model", f.required(hf, "d_model"))
    heads = f.as_int("n_heads", f.required(hf, "n_heads"))
    if d_model % heads:
        raise f.bad("d_model", d_model, f"must be a multiple of n_heads={heads}")
    if hf.get("mlp_hidden_size") is None:
        mlp = f.as_int("mlp_ratio", hf.get("mlp_ratio", 4)) * d_model
    else:
        mlp = f.as_int("mlp_hidden_size", hf["mlp_hidden_size"])
    vocab_key = "embedding_size" if hf.get("embedding_size") is not None else "vocab_size"
    vocab = f.as_int(vocab_key, f.required(hf, vocab_key))
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=mlp,
        num_layers=f.as_int("n_layers", f.required(hf, "n_layers")),
        num_heads=heads,
        num_kv_heads=f.kv_heads(hf, "n_kv_heads", heads),
        head_dim=d_model // heads,
        rms_norm_eps=f.as_float("rms_norm_eps", hf.get("rms_norm_eps", 1e-5)),
        rope_theta=f.as_float("rope_theta", hf.get("rope_theta", 10000.0)),
        max_position_embeddings=f.as_int("max_sequence_length",
                                         hf.get("max_sequence_length", 4096)),
        tie_word_embeddings=f.as_bool("weight_tying", hf.get("weight_tying", False)),
        initializer_range=f.as_float("init_std", hf.get("init_std", 0.02)),
        mask_token_id=f.token_id("mask_token_id", hf.get("mask_token_id"), vocab),
        eos_token_ids=f.eos_ids(hf.get("eos_token_id")),
        block_size=None,
    )


def with_layers(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A copy of the config keeping only the first `num_layers` layers."""
    return dict(hf, n_layers=num_layers)
