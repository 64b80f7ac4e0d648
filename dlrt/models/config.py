"""The frozen model config: a checkpoint's architecture, normalised from its `config.json` by
its family's normaliser (`dlrt.models.registry.model_config`).

Field names follow Qwen3 (`hidden_size`, `num_attention_heads`, ...); families with other names
(LLaDA's OLMo-style `d_model`, `n_heads`, ...) translate them in their normaliser, so models
never read raw config dicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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
    # MoE (sdar_moe, llada2); zero experts means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()
    router_scoring: str = "softmax"  # "softmax" (Qwen3-MoE) | "sigmoid" (LLaDA2)
    n_group: int = 1  # group-limited top-k: experts in n_group groups, the best topk_group kept
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    num_shared_experts: int = 0  # a shared SwiGLU of num_shared * moe_intermediate_size
    # attention
    rotary_dim: int | None = None  # RoPE on each head's first rotary_dim dims (None: all)
    use_qk_norm: bool = True  # per-head q/k RMSNorm (families that make it optional read it)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
