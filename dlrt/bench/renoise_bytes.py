"""Bytes of a renoising round's two vocabulary-sized ops (DiffusionGemma), for the HBM floor of
`bench step` beside `step.round_bytes` (which counts weights, the LM head and the KV cache, and
the embedding table as B rows only).

Each round of a canvas of n positions over V tokens (hidden size d) runs, besides the layers:
  soft_embedding (`dlrt.kernels.soft_embedding`): reads the previous round's divided logits
      [n, V] (the self-conditioning buffer, the model dtype) and the whole embedding matrix
      [V, d] once (the tied LM head reads it too, in its own pass), writes [n, d];
  denoiser_draw (`dlrt.kernels.denoiser`): reads the logits [n, V] (fp32), writes the divided
      logits [n, V] into the self-conditioning buffer, and the sample, argmax and entropy [n].
The counts are each input read once and each output written once (the kernels' partial sums,
a few MB, are left out).
"""

from __future__ import annotations

import torch

from dlrt.models.config import ModelConfig


def renoise_vocab_bytes(config: ModelConfig, canvas: int | None = None,
                        dtype: torch.dtype = torch.bfloat16,
                        logits_dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """{"soft_embedding", "denoiser_draw", "total"}: the bytes those ops move in one round.

    Args:
        config: the model's (vocab_size, hidden_size, canvas_length).
        canvas: positions per round (default: `config.canvas_length`).
        dtype: the model dtype (embedding matrix, self-conditioning buffer, soft embeddings).
        logits_dtype: the LM head's logits (DiffusionGemma's: fp32, soft-capped).
    Raises:
        ValueError: no canvas given and none in the config.
    """
    n = canvas if canvas is not None else config.canvas_length
    if n is None:
        raise ValueError(f"{config.family} has no canvas_length: give the canvas size")
    v, d = config.vocab_size, config.hidden_size
    item = torch.empty((), dtype=dtype).element_size()
    logit_item = torch.empty((), dtype=logits_dtype).element_size()
    soft = n * v * item + v * d * item + n * d * item
    draw = n * v * logit_item + n * v * item + n * (8 + 8 + 4)
    return {"soft_embedding": soft, "denoiser_draw": draw, "total": soft + draw}
