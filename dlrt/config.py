"""The frozen model config: one normaliser from a Hugging Face `config.json` to `ModelConfig`.

Field names follow Qwen3 (`hidden_size`, `num_attention_heads`, ...). LLaDA's OLMo-style fields
(`d_model`, `n_heads`, ...) are translated here, so models never read raw config dicts.
"""

from __future__ import annotations

import dataclasses
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
        ConfigError: the `model_type` (and `architectures`) name no supported family.
    """
    model_type = hf.get("model_type")
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
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
    qk_norm: bool
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

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def from_hf(hf: dict[str, Any]) -> ModelConfig:
        """Normalise a raw `config.json` dict.

        Raises:
            ConfigError: unknown family, a missing required field, or an unsupported feature
                (rope scaling, sliding window, attention bias).
        """
        family = resolve_family(hf)
        if family == "llada":
            return _from_llada(hf)
        return _from_qwen3(hf, family)


def _req(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise ConfigError(f"config.json lacks required field {key!r}")
    return hf[key]


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def _from_qwen3(hf: dict[str, Any], family: str) -> ModelConfig:
    if hf.get("rope_scaling"):
        raise ConfigError(f"rope_scaling {hf['rope_scaling']!r} is not supported")
    if hf.get("use_sliding_window"):
        raise ConfigError("use_sliding_window=true is not supported")
    if hf.get("attention_bias"):
        raise ConfigError("attention_bias=true is not supported")
    hidden = int(_req(hf, "hidden_size"))
    heads = int(_req(hf, "num_attention_heads"))
    num_layers = int(_req(hf, "num_hidden_layers"))
    moe: dict[str, Any] = {}
    if family == "sdar_moe":
        step = int(hf.get("decoder_sparse_step", 1) or 1)
        dense = set(hf.get("mlp_only_layers") or [])
        moe = dict(
            num_experts=int(_req(hf, "num_experts")),
            num_experts_per_tok=int(_req(hf, "num_experts_per_tok")),
            moe_intermediate_size=int(_req(hf, "moe_intermediate_size")),
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            moe_layers=tuple(
                i for i in range(num_layers) if i not in dense and (i + 1) % step == 0
            ),
        )
    return ModelConfig(
        family=family,
        vocab_size=int(_req(hf, "vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_req(hf, "intermediate_size")),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hidden // heads),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(hf.get("rope_theta", 10000.0)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        qk_norm=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        mask_token_id=hf.get("mask_token_id"),
        eos_token_ids=_eos(hf.get("eos_token_id")),
        block_size=hf.get("block_size"),
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
    d_model = int(_req(hf, "d_model"))
    heads = int(_req(hf, "n_heads"))
    mlp = hf.get("mlp_hidden_size") or int(hf.get("mlp_ratio", 4)) * d_model
    vocab = hf.get("embedding_size") or _req(hf, "vocab_size")
    return ModelConfig(
        family="llada",
        vocab_size=int(vocab),
        hidden_size=d_model,
        intermediate_size=int(mlp),
        num_layers=int(_req(hf, "n_layers")),
        num_heads=heads,
        num_kv_heads=int(hf.get("n_kv_heads") or heads),
        head_dim=d_model // heads,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        rope_theta=float(hf.get("rope_theta", 10000.0)),
        max_position_embeddings=int(hf.get("max_sequence_length", 4096)),
        qk_norm=False,
        tie_word_embeddings=bool(hf.get("weight_tying", False)),
        initializer_range=float(hf.get("init_std", 0.02)),
        mask_token_id=hf.get("mask_token_id"),
        eos_token_ids=_eos(hf.get("eos_token_id")),
        block_size=None,
    )
