"""SDAR dense and MoE (JetAstra/SDAR): Qwen3 / Qwen3-MoE layout with block-diffusion attention."""

from dlrt.models.family import Family, RoundWeights
from dlrt.models.hf import with_layers
from dlrt.models.sdar.config import sdar_config
from dlrt.models.sdar.model import SDARForCausalLM

_COMMON = dict(normalise=sdar_config, model=SDARForCausalLM, default_decoder="block",
               with_layers=with_layers, embedding="model.embed_tokens.weight",
               tokenizer="sdar-qwen3",
               tp_plan=(("*.self_attn.qkv_proj", "heads"), ("*.self_attn.o_proj", "row"),
                        ("lm_head", "vocab")))
_LAYER = "model.layers.{layer}."
# the dense model's weights in the persistent round (not the MoE model's: its experts)
_ROUND = RoundWeights(
    embedding="model.embed_tokens.weight", qkv=_LAYER + "self_attn.qkv_proj.weight",
    o=_LAYER + "self_attn.o_proj.weight", gate_up=_LAYER + "mlp.gate_up_proj.weight",
    down=_LAYER + "mlp.down_proj.weight", lm_head="lm_head.weight",
    input_norm=_LAYER + "input_layernorm.weight",
    post_norm=_LAYER + "post_attention_layernorm.weight",
    q_norm=_LAYER + "self_attn.q_norm.weight", k_norm=_LAYER + "self_attn.k_norm.weight",
    final_norm="model.norm.weight", rotary="model.rotary_emb")
SDAR = Family(name="sdar", model_types=("sdar",), architectures=("SDARForCausalLM",),
              round_weights=_ROUND, **_COMMON)
SDAR_MOE = Family(name="sdar_moe", model_types=("sdar_moe",),
                  architectures=("SDARMoeForCausalLM",), **_COMMON)
