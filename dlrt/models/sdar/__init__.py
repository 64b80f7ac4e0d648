"""SDAR dense and MoE (JetAstra/SDAR): Qwen3 / Qwen3-MoE layout with block-diffusion attention."""

from dlrt.models.family import Family
from dlrt.models.hf import with_layers
from dlrt.models.sdar.config import sdar_config
from dlrt.models.sdar.model import SDARForCausalLM

_COMMON = dict(normalise=sdar_config, model=SDARForCausalLM, decoders=("block",),
               with_layers=with_layers, embedding="model.embed_tokens.weight",
               tokenizer="sdar-qwen3",
               tp_plan=(("*.self_attn.qkv_proj", "heads"), ("*.self_attn.o_proj", "row"),
                        ("lm_head", "vocab")))
SDAR = Family(name="sdar", model_types=("sdar",), architectures=("SDARForCausalLM",),
              **_COMMON)
SDAR_MOE = Family(name="sdar_moe", model_types=("sdar_moe",),
                  architectures=("SDARMoeForCausalLM",), **_COMMON)
