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

from dlrt.attention.base import CHUNK_KV, LAYER_SHAPES, SLIDING_WINDOW

SLIDING, FULL = "sliding_attention", "full_attention"  # `layer_types` values


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
    attention_scale: float | None = None  # the q.k multiplier (None: head_dim ** -0.5)
    # layers of two kinds (DiffusionGemma); no layer_types: every layer full attention with
    # head_dim, num_kv_heads and rope_theta
    layer_types: tuple[str, ...] = ()  # SLIDING or FULL, one per layer
    sliding_window: int | None = None  # a sliding layer's query sees W keys, itself included
    global_head_dim: int | None = None  # full-attention layers' head size (None: head_dim)
    num_global_kv_heads: int | None = None  # their KV heads (None: num_kv_heads)
    attention_k_eq_v: bool = False  # full-attention layers have no v_proj: V is K's projection
    global_rope_theta: float | None = None  # full-attention layers' RoPE theta
    # proportional RoPE of full-attention layers: only the first P of the head's D/2
    # frequency pairs turn, at theta ** (-2i / D) (None: all D/2, the default RoPE)
    global_rope_pairs: int | None = None
    hidden_act: str = "silu"  # MLP and expert activation: "silu" | "gelu_pytorch_tanh"
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap), in fp32
    embed_scale: float | None = None  # token embeddings are multiplied by it (None: not scaled)
    canvas_length: int | None = None  # positions a decoder pass denoises (DiffusionGemma)
    image_token_id: int | None = None  # the placeholder of image input (not served: text only)

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` is a sliding-window layer."""
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    def layer_head_dim(self, layer: int) -> int:
        """Head size of `layer`'s queries, keys and values."""
        if self.layer_types and not self.is_sliding(layer) and self.global_head_dim:
            return self.global_head_dim
        return self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """KV heads of `layer`."""
        if self.layer_types and not self.is_sliding(layer) and self.num_global_kv_heads:
            return self.num_global_kv_heads
        return self.num_kv_heads

    def layer_window(self, layer: int) -> int | None:
        """The window W of a sliding layer (its queries see no key W or more positions
        before them; `dlrt.attention.base`), None for a full-attention layer."""
        return self.sliding_window if self.is_sliding(layer) else None

    def kv_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head size) of each layer's cache."""
        return tuple((self.layer_kv_heads(i), self.layer_head_dim(i))
                     for i in range(self.num_layers))

    def attention_needs(self) -> tuple[str, ...]:
        """What the model's attention needs beyond one head shape, no window and forwards
        that write their chunk (`AttentionBackend.supports`' `needs`): SLIDING_WINDOW,
        LAYER_SHAPES, CHUNK_KV (a model with a decoder pass over a canvas, DiffusionGemma's,
        which writes nothing to the cache)."""
        needs = []
        if any(self.layer_window(i) is not None for i in range(self.num_layers)):
            needs.append(SLIDING_WINDOW)
        if len(set(self.kv_shapes())) > 1:
            needs.append(LAYER_SHAPES)
        if self.canvas_length is not None:
            needs.append(CHUNK_KV)
        return tuple(needs)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
