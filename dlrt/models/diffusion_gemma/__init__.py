"""DiffusionGemma (google/diffusiongemma-26B-A4B-it, transformers' `diffusion_gemma`): a
causal encoder that writes the KV cache and a bidirectional canvas decoder over the same
weights; uniform-state diffusion (no mask token), self-conditioning, text input only."""

from dlrt.models.diffusion_gemma.config import diffusion_gemma_config, with_layers
from dlrt.models.diffusion_gemma.model import DiffusionGemmaForBlockDiffusion
from dlrt.models.diffusion_gemma.prompt import check_text_only
from dlrt.models.family import Family

# NOTE: its decoder, "renoise" (uniform-state diffusion: causal encoder passes that write the
# cache, bidirectional canvas passes that read it); no mask-token decoder fits its
# "encoder_decoder" attention.
DIFFUSION_GEMMA = Family(
    name="diffusion_gemma", model_types=("diffusion_gemma",),
    architectures=("DiffusionGemmaForBlockDiffusion",), normalise=diffusion_gemma_config,
    model=DiffusionGemmaForBlockDiffusion, default_decoder="renoise", attention="encoder_decoder",
    with_layers=with_layers, embedding="model.decoder.embed_tokens.weight",
    check_prompt=check_text_only)
