"""LLaDA2 MoE (inclusionAI/LLaDA2.0): block diffusion, sigmoid-routed experts, partial RoPE."""

from dlrt.decoding.options import DecoderDefaults
from dlrt.models.family import Family
from dlrt.models.hf import with_layers
from dlrt.models.llada2.config import llada2_config
from dlrt.models.llada2.model import LLaDA2MoeModelLM

LLADA2 = Family(name="llada2", model_types=("llada2_moe",),
                architectures=("LLaDA2MoeModelLM",), normalise=llada2_config,
                model=LLaDA2MoeModelLM, default_decoder="block", with_layers=with_layers,
                embedding="model.word_embeddings.weight", tokenizer=None,
                decoder_defaults=DecoderDefaults(block_length=32,
                                                 remasking_strategy="threshold", threshold=0.95),
                supports_editing=True,
                tp_plan=(("*.attention.query_key_value", "heads"), ("*.attention.dense", "row"),
                         ("lm_head", "vocab")))
