"""LLaDA (ML-GSAI/LLaDA) and dLLM-Var (LLaDA weights, block decoding with look-ahead)."""

from dlrt.models.family import Family
from dlrt.models.llada.config import llada_config, with_layers
from dlrt.models.llada.model import LLaDAModelLM

# NOTE: LLaDA-Instruct ends a turn with <|eot_id|> (126348) and pads with <|endoftext|> (126081).
LLADA = Family(name="llada", model_types=("llada",), architectures=("LLaDAModelLM",),
               normalise=llada_config, model=LLaDAModelLM, default_decoder="canvas",
               attention="full", with_layers=with_layers, embedding="model.transformer.wte.weight",
               stop_ids=(126081, 126348),
               tp_plan=(("*.qkv", "heads"), ("*.attn_out", "row"), ("*.ff_gate_up", "column"),
                        ("*.blocks.*.ff_out", "row"), ("model.transformer.ff_out", "vocab")))
