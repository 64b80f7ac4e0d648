"""DiffusionGemma (transformers' `DiffusionGemmaForBlockDiffusion`, text only): one backbone
used two ways with the same weights.

- Encoder mode (`encode`): causal attention over the prompt, then over each committed canvas;
  writes the KV cache. Sliding layers see the W keys up to each query.
- Decoder mode (`decode`): the canvas positions attend to each other bidirectionally and read
  the cached prefix (sliding layers: its last W - 1 positions). Like the reference's, it writes
  nothing to the cache: the canvas's K/V reach the attention backend beside it (CHUNK_KV,
  `dlrt.attention.base`).

The decoder's input embeddings pass the self-conditioning MLP: with the previous round's logits
[L, V], soft embeddings softmax(logits) @ E * sqrt(H) (the ops table's `soft_embedding`: one
pass over V with Triton) go through `pre_norm` and the gated MLP and are added to the token
embeddings, then `post_norm` (no weight); on a canvas's first round the signal is zero and
only `post_norm` remains. Embeddings are scaled by sqrt(H) (in the model
dtype); the LM head is the embedding matrix; logits are soft-capped in fp32:
cap * tanh(logits / cap).

Module names equal the checkpoint keys: `model.decoder.*` (every weight both modes share),
`model.decoder.self_conditioning.*`, and `model.encoder.language_model.layers.{i}.layer_scalar`
(the encoder's own layer scalars). The vision tower (`model.encoder.vision_tower.*`,
`model.encoder.embed_vision.*`) is not built: its tensors are skipped at load
(`checkpoint_skips`). Quantised (`dlrt.checkpoint.quant`), the routers' projections stay in the
model dtype (`keep_unquantized`); the routed experts, stored stacked, are read per expert and
part from a quantised checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrt.attention.base import ForwardContext
from dlrt.layers.linear import Linear
from dlrt.layers.mlp import GatedMLP
from dlrt.layers.norm import Fp32RMSNorm
from dlrt.layers.rotary import RotaryEmbedding
from dlrt.models.config import FULL, SLIDING, ModelConfig
from dlrt.models.diffusion_gemma.layers import DiffusionGemmaLayer
from dlrt.ops import Ops


class SelfConditioning(GatedMLP):
    """(token embeddings [L, H], soft embeddings [L, H] or None) -> [L, H]:
    post_norm(embeddings + down_proj(act(gate_proj(s)) * up_proj(s))), s = pre_norm(soft);
    with None (no signal: zeros, whose MLP output is exactly zero) post_norm(embeddings)."""

    def __init__(self, config: ModelConfig):
        c = config
        super().__init__(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.pre_norm = Fp32RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_norm = Fp32RMSNorm(c.hidden_size, c.rms_norm_eps, weight=False)

    def forward(self, embeddings: torch.Tensor, soft: torch.Tensor | None) -> torch.Tensor:
        if soft is None:
            return self.post_norm(embeddings)
        return self.post_norm(embeddings + super().forward(self.pre_norm(soft)))


class _LayerScalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer_scalar = nn.Parameter(torch.ones(1))


class Encoder(nn.Module):
    """What the encoder keeps apart from the decoder: its layer scalars
    (`language_model.layers[i].layer_scalar` [1]); every other weight is the decoder's (tied
    in the reference)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.language_model = nn.Module()
        self.language_model.layers = nn.ModuleList(_LayerScalar()
                                                   for _ in range(config.num_layers))


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DiffusionGemmaLayer(c, i, ops) for i in range(c.num_layers))
        self.norm = Fp32RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_conditioning = SelfConditioning(c)
        # NOTE: CPU tensors even when the model is built on the meta device
        self.rotary_emb = nn.ModuleDict({
            SLIDING: RotaryEmbedding(c.head_dim, c.rope_theta),
            FULL: RotaryEmbedding(c.layer_head_dim(c.num_layers - 1), c.global_rope_theta,
                                  pairs=c.global_rope_pairs)})
        self.register_buffer("embed_scale", torch.tensor(c.embed_scale, device="cpu"),
                             persistent=False)  # fp32, cast to the model dtype where used


class DiffusionGemmaModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.encoder = Encoder(config)
        self.decoder = Decoder(config, ops)


class DiffusionGemmaForBlockDiffusion(nn.Module):
    """The two modes (see the module docstring) over one set of weights.

    forward(input_ids [N] int64, positions [N] int64, ctx, self_conditioning=None) -> hidden
        [N, H]: the mode follows the chunk's attention: `encode` for a causal chunk
        (ctx.meta.chunk_block == 1), `decode` for a full one (chunk_block None).
    logits(hidden [n, H]) -> [n, V] fp32, soft-capped.
    """

    # checkpoint tensors of the parts not built here (image input is not served)
    checkpoint_skips = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
    # linear layers kept in the model dtype under every quantisation (not-convert entries,
    # `dlrt.checkpoint.quant.matches`): the routers' projections, as every family's router
    keep_unquantized = ("router",)

    def __init__(self, config: ModelConfig, ops: Ops):
        super().__init__()
        self.config = config
        self.ops = ops
        self.model = DiffusionGemmaModel(config, ops)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        self.lm_head.weight = self.model.decoder.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                self_conditioning: torch.Tensor | None = None) -> torch.Tensor:
        block = ctx.meta.chunk_block
        if block is None:
            return self.decode(input_ids, positions, ctx, self_conditioning)
        if block != 1 or self_conditioning is not None:
            raise ValueError(f"DiffusionGemma runs causal chunks (chunk_block 1, the encoder, "
                             f"without self-conditioning) or full ones (the decoder); got "
                             f"chunk_block {block}")
        return self.encode(input_ids, positions, ctx)

    def encode(self, input_ids: torch.Tensor, positions: torch.Tensor,
               ctx: ForwardContext) -> torch.Tensor:
        """Encoder mode: tokens [N] at positions [N], causal (ctx.meta.chunk_block 1); writes
        their K/V into the cache. Returns the normed hidden states [N, H] (the reference's
        `encoder_last_hidden_state`; generation uses only the cache)."""
        scalars = [m.layer_scalar for m in self.model.encoder.language_model.layers]
        return self._layers(self._embed(input_ids), positions, ctx, scalars)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
               self_conditioning: torch.Tensor | None = None,
               self_conditioning_probs: torch.Tensor | None = None) -> torch.Tensor:
        """Decoder mode: the canvas [L] at positions [L] (after the cached prefix), full
        attention over the prefix and the canvas (ctx.meta.chunk_block None; kv_len = start +
        L); writes nothing to the cache. Returns the normed hidden states [L, H] (`logits`
        turns them into the LM's).

        self_conditioning: the previous round's logits [L, V] (any float dtype), turned into
            probabilities by a softmax in fp32 (the reference's generate() hands its processed
            logits cast to the model dtype) and into soft embeddings by the ops table's
            `soft_embedding`; or self_conditioning_probs [L, V], those probabilities
            themselves. Neither: the canvas's first round (no signal).
        Raises:
            ValueError: both signals given.
        """
        if self_conditioning is not None and self_conditioning_probs is not None:
            raise ValueError("give self_conditioning (logits) or self_conditioning_probs, "
                             "not both")
        d = self.model.decoder
        x = self._embed(input_ids)  # [L, H]
        soft = None  # soft embeddings [L, H]
        if self_conditioning is not None:
            # NOTE: the scale as a number (`embed_scale` holds it in fp32): no device read
            soft = self.ops.soft_embedding(self_conditioning, d.embed_tokens.weight,
                                           self.config.embed_scale)
        elif self_conditioning_probs is not None:
            probs = self_conditioning_probs.to(x.dtype)
            soft = (probs @ d.embed_tokens.weight) * d.embed_scale.to(x.dtype)
        x = d.self_conditioning(x, soft)
        return self._layers(x, positions, ctx, [layer.layer_scalar for layer in d.layers])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, H] -> logits [n, V] fp32: cap * tanh(lm_head(hidden) / cap)."""
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        d = self.model.decoder
        x = d.embed_tokens(input_ids)
        return x * d.embed_scale.to(x.dtype)

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                scalars: list[torch.Tensor]) -> torch.Tensor:
        d, c = self.model.decoder, self.config
        rope = {kind: rot.cos_sin(positions) for kind, rot in d.rotary_emb.items()}
        for i, layer in enumerate(d.layers):
            kind = c.layer_types[i]
            x = layer(x, rope[kind], d.rotary_emb[kind], ctx, scalars[i])
        return d.norm(x)
