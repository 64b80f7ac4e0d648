"""SDAR dense and MoE: the Qwen3 / Qwen3-MoE layout with block-causal attention."""
