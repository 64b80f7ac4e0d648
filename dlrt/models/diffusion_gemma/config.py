"""DiffusionGemma's `config.json` (transformers' `DiffusionGemmaConfig`: the text geometry under
`text_config`, a vision tower under `vision_config`) -> `ModelConfig`.

Defaults for absent fields are `DiffusionGemmaTextConfig`'s and `DiffusionGemmaConfig`'s: layer
types 5 sliding : 1 full, the last layer always full attention (the reference forces it);
sliding RoPE "default" theta 1e4, full RoPE "proportional" theta 1e6 with partial rotary factor
0.25; full-attention layers with `global_head_dim` (512) and `num_global_key_value_heads`
(else `num_key_value_heads`) KV heads, or the head size and KV heads a saved config lists in
`per_layer_config`; softcap 30; canvas 256; image token 258880. The reference builds every
full-attention layer with K = V (no v_proj) and attention scale 1.0, and scales the embeddings
by sqrt(hidden_size).
"""

from __future__ import annotations

import math
from typing import Any

from dlrt.errors import ConfigError
from dlrt.models import hf as f
from dlrt.models.config import FULL, SLIDING, ModelConfig
from dlrt.models.diffusion_gemma.rope import rope_fields

ACTIVATIONS = ("gelu_pytorch_tanh", "silu")
DEFAULTS = dict(vocab_size=262_144, hidden_size=2304, intermediate_size=9216,
                num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                max_position_embeddings=131_072, rms_norm_eps=1e-6, sliding_window=512,
                initializer_range=0.02, global_head_dim=512, final_logit_softcapping=30.0,
                eos_token_id=1)
SLIDING_PATTERN = 6  # without layer_types: every sixth layer full attention


def diffusion_gemma_config(hf: dict[str, Any], family: str = "diffusion_gemma") -> ModelConfig:
    """Normalise a DiffusionGemma config (`model_type: diffusion_gemma`).

    Raises:
        ConfigError: no `text_config` (a vision-only config), a required field missing, a
            field of the wrong type or out of range (named with its `text_config.` prefix), or
            an unsupported feature (untied embeddings, attention bias, text attention
            bidirectional in the encoder, a RoPE type other than default / proportional).
    """
    t = hf.get("text_config")
    if not isinstance(t, dict):
        raise ConfigError("config.json has no text_config: DiffusionGemma's text model is "
                          f"described there (a vision-only config is not served); got {t!r}")
    _refuse_unsupported(hf, t)
    get = lambda key: _field(t, key)  # noqa: E731
    heads = f.as_int("text_config.num_attention_heads", get("num_attention_heads"))
    kv = f.as_int("text_config.num_key_value_heads", get("num_key_value_heads"))
    _divides("text_config.num_key_value_heads", kv, heads)
    num_layers = f.as_int("text_config.num_hidden_layers", get("num_hidden_layers"))
    types = layer_types(t, num_layers)
    head_dim = f.as_int("text_config.head_dim", get("head_dim"))
    global_dim, global_kv = _full_layer_shape(t, types, head_dim, kv)
    _divides("num_global_key_value_heads", global_kv, heads)
    vocab = f.as_int("text_config.vocab_size", get("vocab_size"))
    hidden = f.as_int("text_config.hidden_size", get("hidden_size"))
    top_k = f.as_int("text_config.top_k_experts", _required(t, "top_k_experts"))
    experts = f.as_int("text_config.num_experts", _required(t, "num_experts"))
    if top_k > experts:
        raise f.bad("text_config.top_k_experts", top_k, f"exceeds num_experts={experts}")
    image = f.optional(hf, "image_token_id", 258_880)
    context = f.as_int("text_config.max_position_embeddings", get("max_position_embeddings"))
    canvas = f.as_int("canvas_length", f.optional(hf, "canvas_length", 256))
    if canvas >= context:
        raise f.bad("canvas_length", canvas, f"must be below text_config.max_position_embeddings="
                                             f"{context} (a request needs a prompt token and a "
                                             "whole canvas)")
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=f.as_int("text_config.intermediate_size", get("intermediate_size")),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=f.as_float("text_config.rms_norm_eps", get("rms_norm_eps")),
        max_position_embeddings=context,
        tie_word_embeddings=True,
        initializer_range=f.as_float("text_config.initializer_range",
                                     get("initializer_range")),
        mask_token_id=None,  # uniform-state diffusion: a rejected position gets a random token
        eos_token_ids=f.eos_ids(get("eos_token_id")),
        block_size=None,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=f.as_int("text_config.moe_intermediate_size",
                                       _required(t, "moe_intermediate_size")),
        norm_topk_prob=True,
        moe_layers=tuple(range(num_layers)),
        attention_scale=1.0,
        layer_types=types,
        sliding_window=f.as_int("text_config.sliding_window", get("sliding_window")),
        global_head_dim=global_dim,
        num_global_kv_heads=global_kv,
        attention_k_eq_v=True,
        hidden_act=t.get("hidden_activation") or "gelu_pytorch_tanh",
        final_logit_softcapping=f.as_float("text_config.final_logit_softcapping",
                                           get("final_logit_softcapping")),
        embed_scale=math.sqrt(hidden),
        canvas_length=canvas,
        image_token_id=f.as_int("image_token_id", image, minimum=0),
        **rope_fields(t, types, head_dim, global_dim),
    )


def _field(t: dict[str, Any], key: str) -> Any:
    """text_config[key], or the reference's default when absent or null."""
    return f.optional(t, key, DEFAULTS[key])


def _required(t: dict[str, Any], key: str) -> Any:
    if t.get(key) is None:
        raise ConfigError(f"config.json lacks required field 'text_config.{key}'")
    return t[key]


def _divides(key: str, kv: int, heads: int) -> None:
    if heads % kv:
        raise f.bad(key, kv, f"must divide the number of attention heads ({heads})")


def _refuse_unsupported(hf: dict[str, Any], t: dict[str, Any]) -> None:
    for where, cfg in (("tie_word_embeddings", hf), ("text_config.tie_word_embeddings", t)):
        if not f.as_bool(where, cfg.get("tie_word_embeddings", True)):
            raise ConfigError(f"{where}=false is not supported: the reference then unties the "
                              "LM head and the encoder from the decoder's weights")
    if t.get("attention_bias"):
        raise ConfigError("text_config.attention_bias=true is not supported")
    if t.get("use_bidirectional_attention") not in (None, "vision"):
        raise f.bad("text_config.use_bidirectional_attention",
                    t["use_bidirectional_attention"],
                    "is not supported: only causal text attention in the encoder (null or "
                    "'vision'); with 'all' the reference also halves the window "
                    "(sliding_window // 2 + 1)")
    act = t.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise f.bad("text_config.hidden_activation", act, f"is not supported ({ACTIVATIONS})")
    if "attention_k_eq_v" in t:  # NOTE: read by the reference only before it is set: no effect
        f.as_bool("text_config.attention_k_eq_v", t["attention_k_eq_v"])


def layer_types(t: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """text_config's `layer_types` (default: every SLIDING_PATTERN-th layer full attention),
    the last layer full attention whatever it says (as the reference forces it)."""
    given = t.get("layer_types")
    if given is None:
        types = [SLIDING if (i + 1) % SLIDING_PATTERN else FULL for i in range(num_layers)]
    elif not isinstance(given, list) or len(given) != num_layers \
            or any(x not in (SLIDING, FULL) for x in given):
        raise f.bad("text_config.layer_types", given,
                    f"must list {num_layers} of {SLIDING!r} / {FULL!r}")
    else:
        types = list(given)
    types[-1] = FULL
    return tuple(types)


def _full_layer_shape(t: dict[str, Any], types: tuple[str, ...], head_dim: int,
                      kv: int) -> tuple[int, int]:
    """(head size, KV heads) of the full-attention layers: from a saved config's
    `per_layer_config` (layer index -> overrides; the same for every full layer, none for a
    sliding one), else `global_head_dim` and `num_global_key_value_heads` (default: kv)."""
    per_layer = t.get("per_layer_config")
    if per_layer is None:
        dim = f.as_int("text_config.global_head_dim", _field(t, "global_head_dim"))
        heads = f.as_int("text_config.num_global_key_value_heads",
                         f.optional(t, "num_global_key_value_heads", kv))
        return dim, heads
    key = "text_config.per_layer_config"
    if not isinstance(per_layer, dict):
        raise f.bad(key, per_layer, "must map layer indices to overrides")
    shapes = set()
    for i, kind in enumerate(types):
        over = per_layer.get(str(i), per_layer.get(i, {}))
        if not isinstance(over, dict) or set(over) - {"head_dim", "num_key_value_heads"}:
            raise f.bad(f"{key}.{i}", over, "may only override head_dim, num_key_value_heads")
        if kind == SLIDING and over:
            raise f.bad(f"{key}.{i}", over, "overrides a sliding layer: not supported")
        if kind == FULL:
            shapes.add((f.as_int(f"{key}.{i}.head_dim", over.get("head_dim", head_dim)),
                        f.as_int(f"{key}.{i}.num_key_value_heads",
                                 over.get("num_key_value_heads", kv))))
    if len(shapes) != 1:
        raise f.bad(key, per_layer, "gives full-attention layers different shapes: not "
                                    "supported")
    return shapes.pop()


def with_layers(hf: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A copy of the config keeping only its first `num_layers` layers (make-checkpoint)."""
    t = dict(hf["text_config"], num_hidden_layers=num_layers)
    if isinstance(t.get("layer_types"), list):
        t["layer_types"] = t["layer_types"][:num_layers]
    per_layer = t.get("per_layer_config")
    if isinstance(per_layer, dict) and per_layer:
        # NOTE: the new last layer is full attention (forced), with the full layers' shape
        full = next(iter(per_layer.values()))
        t["per_layer_config"] = {**{k: v for k, v in per_layer.items()
                                    if int(k) < num_layers - 1}, str(num_layers - 1): full}
    return dict(hf, text_config=t)
