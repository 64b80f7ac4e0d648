"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B): LLaDA's full-attention masked diffusion on an
OLMoE-style model (per-head q/k RMSNorm, RoPE, softmax top-k experts without renormalisation).

Its module tree and tensor names are SDAR-MoE's (Qwen3-MoE's: `model.layers.{i}.self_attn.
{q,k,v,o}_proj`, `q_norm`, `k_norm`, `mlp.gate`, `mlp.experts.{e}.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`, `model.embed_tokens`, `model.norm`, `lm_head`),
so the model is `SDARForCausalLM`: only the attention pattern (full) and the router's rule
(`norm_topk_prob` False) differ, and the decoder and the config carry those.
"""

from dlrt.models.family import Family
from dlrt.models.llada_moe.config import llada_moe_config, with_layers
from dlrt.models.sdar.model import SDARForCausalLM

# NOTE: the published config may say model_type "llada" (the dense model's) with this
# architecture: `dlrt.models.registry.family_of` tells the two apart by the architecture.
LLADA_MOE = Family(name="llada_moe", model_types=("lladamoe", "llada"),
                   architectures=("LLaDAMoEModelLM",), normalise=llada_moe_config,
                   model=SDARForCausalLM, default_decoder="canvas", attention="full",
                   with_layers=with_layers, embedding="model.embed_tokens.weight",
                   tokenizer=None,
                   tp_plan=(("*.self_attn.qkv_proj", "heads"), ("*.self_attn.o_proj", "row"),
                            ("lm_head", "vocab")))
