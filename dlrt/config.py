"""The frozen model config: one normaliser from a Hugging Face `config.json` to `ModelConfig`.

Field names follow Qwen3 (`hidden_size`, `num_attention_heads`, ...). LLaDA's OLMo-style fields
(`d_model`, `n_heads`, ...) are translated here, so models never read raw config dicts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dlrt.errors import ConfigError

# model_type / architectures -> family name. A family is a model layout (models/<family>/).
_MODEL_TYPES = {"sdar": "sdar", "sdar_moe": "sdar_moe", "llada": "llada"}
_ARCHITECTURES = {
    "SDARForCausalLM": "sdar",
    "SDARMoeForCausalLM": "sdar_moe",
    "LLaDAModelLM": "llada",
}
_LATER = {"llada2_moe": "LLaDA2 MoE"}


def resolve_family(hf: dict[str, Any]) -> str:
    """Return the family name of a raw config dict.

    Raises:
        ConfigError: the `model_type` names no supported family (or, when there is no
            `model_type`, neither do the `architectures`).
    """
    model_type = hf.get("model_type")
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    if model_type is None:  # only a config without model_type is read by its architectures
        for arch in hf.get("architectures") or []:
            if arch in _ARCHITECTURES:
                return _ARCHITECTURES[arch]
    if model_type in _LATER:
        raise ConfigError(f"model_type {model_type!r} ({_LATER[model_type]}) is not supported yet")
    raise ConfigError(
        f"unknown model_type {model_type!r} (architectures {hf.get('architectures')}); "
        f"supported: {sorted(_MODEL_TYPES)}"
    )


@dataclass(frozen=True)
class ModelConfig:
    """Normalised architecture of one checkpoint. Sizes in elements, lengths in tokens."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    initializer_range: float
    mask_token_id: int | None
    eos_token_ids: tuple[int, ...]
    block_size: int | None  # the block length the model was trained with, if the config says
    # MoE (sdar_moe); zero experts means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def from_hf(hf: dict[str, Any]) -> ModelConfig:
        """Normalise a raw `config.json` dict.

        Raises:
            ConfigError: unknown family, a missing required field, a field of the wrong type
                or out of range (the message names it and its value), or an unsupported
                feature (rope scaling, sliding window, attention bias, an activation not silu).
        """
        family = resolve_family(hf)
        if family == "llada":
            return _from_llada(hf)
        return _from_qwen3(hf, family)


def _req(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ConfigError(f"config.json lacks required field {key!r}")
    return hf[key]


def _opt(hf: dict[str, Any], key: str, default: Any) -> Any:
    """hf[key], or `default` when the field is absent or null."""
    return default if hf.get(key) is None else hf[key]


def _bad(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"config.json: {key}={value!r} {why}")


def _int(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(key, value, f"must be an integer >= {minimum}")
    return value


def _float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value < math.inf:
        raise _bad(key, value, "must be a finite number > 0")
    return float(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(key, value, "must be true or false")
    return value


def _token_id(key: str, value: Any, vocab_size: int) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value < vocab_size):
        raise _bad(key, value, f"must be a token id in [0, {vocab_size})")
    return value


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    return tuple(_int("eos_token_id", v, minimum=0) for v in ids)


def _kv_heads(hf: dict[str, Any], key: str, heads: int) -> int:
    kv_heads = _int(key, _opt(hf, key, heads))
    if heads % kv_heads:
        raise _bad(key, kv_heads, f"must divide the number of attention heads ({heads})")
    return kv_heads


def _activation(key: str, value: Any) -> None:
    if value != "silu":
        raise _bad(key, value, "is not supported (only silu)")


def _from_qwen3(hf: dict[str, Any], family: str) -> ModelConfig:
    if hf.get("rope_scaling"):
        raise ConfigError(f"rope_scaling {hf['rope_scaling']!r} is not supported")
    if hf.get("use_sliding_window"):
        raise ConfigError("use_sliding_window=true is not supported")
    if hf.get("attention_bias"):
        raise ConfigError("attention_bias=true is not supported")
    _activation("hidden_act", hf.get("hidden_act", "silu"))
    vocab = _int("vocab_size", _req(hf, "vocab_size"))
    hidden = _int("hidden_size", _req(hf, "hidden_size"))
    heads = _int("num_attention_heads", _req(hf, "num_attention_heads"))
    num_layers = _int("num_hidden_layers", _req(hf, "num_hidden_layers"))
    moe: dict[str, Any] = {}
    if family == "sdar_moe":
        step = _int("decoder_sparse_step", _opt(hf, "decoder_sparse_step", 1))
        dense = {_int("mlp_only_layers", i, minimum=0) for i in hf.get("mlp_only_layers") or []}
        experts = _int("num_experts", _req(hf, "num_experts"))
        top_k = _int("num_experts_per_tok", _req(hf, "num_experts_per_tok"))
        if top_k > experts:
            raise _bad("num_experts_per_tok", top_k, f"exceeds num_experts={experts}")
        moe = dict(
            num_experts=experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=_int("moe_intermediate_size", _req(hf, "moe_intermediate_size")),
            norm_topk_prob=_bool("norm_topk_prob", hf.get("norm_topk_prob", True)),
            moe_layers=tuple(
                i for i in range(num_layers) if i not in dense and (i + 1) % step == 0
            ),
        )
    block_size = hf.get("block_size")
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_int("intermediate_size", _req(hf, "intermediate_size")),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=_kv_heads(hf, "num_key_value_heads", heads),
        head_dim=_int("head_dim", _opt(hf, "head_dim", hidden // heads)),
        rms_norm_eps=_float("rms_norm_eps", hf.get("rms_norm_eps", 1e-6)),
        rope_theta=_float("rope_theta", hf.get("rope_theta", 10000.0)),
        max_position_embeddings=_int("max_position_embeddings",
                                     hf.get("max_position_embeddings", 32768)),
        tie_word_embeddings=_bool("tie_word_embeddings", hf.get("tie_word_embeddings", False)),
        initializer_range=_float("initializer_range", hf.get("initializer_range", 0.02)),
        mask_token_id=_token_id("mask_token_id", hf.get("mask_token_id"), vocab),
        eos_token_ids=_eos(hf.get("eos_token_id")),
        block_size=None if block_size is None else _int("block_size", block_size),
        **moe,
    )


def _from_llada(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("alibi"):
        raise ConfigError("LLaDA with alibi=true is not supported")
    if hf.get("block_type", "llama") != "llama":
        raise ConfigError(f"LLaDA block_type {hf.get('block_type')!r} is not supported")
    if hf.get("include_bias") or hf.get("include_qkv_bias"):
        raise ConfigError("LLaDA with biases is not supported")
    if not hf.get("rope", True):
        raise ConfigError("LLaDA without rope is not supported")
    _activation("activation_type", hf.get("activation_type", "silu"))
    d_model = _int("d_model", _req(hf, "d_model"))
    heads = _int("n_heads", _req(hf, "n_heads"))
    if d_model % heads:
        raise _bad("d_model", d_model, f"must be a multiple of n_heads={heads}")
    if hf.get("mlp_hidden_size") is None:
        mlp = _int("mlp_ratio", hf.get("mlp_ratio", 4)) * d_model
    else:
        mlp = _int("mlp_hidden_size", hf["mlp_hidden_size"])
    vocab_key = "embedding_size" if hf.get("embedding_size") is not None else "vocab_size"
    vocab = _int(vocab_key, _req(hf, vocab_key))
    return ModelConfig(
        family="llada",
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=mlp,
        num_layers=_int("n_layers", _req(hf, "n_layers")),
        num_heads=heads,
        num_kv_heads=_kv_heads(hf, "n_kv_heads", heads),
        head_dim=d_model // heads,
        rms_norm_eps=_float("rms_norm_eps", hf.get("rms_norm_eps", 1e-5)),
        rope_theta=_float("rope_theta", hf.get("rope_theta", 10000.0)),
        max_position_embeddings=_int("max_sequence_length", hf.get("max_sequence_length", 4096)),
        tie_word_embeddings=_bool("weight_tying", hf.get("weight_tying", False)),
        initializer_range=_float("init_std", hf.get("init_std", 0.02)),
        mask_token_id=_token_id("mask_token_id", hf.get("mask_token_id"), vocab),
        eos_token_ids=_eos(hf.get("eos_token_id")),
        block_size=None,
    )
