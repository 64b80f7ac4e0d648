"""What a DiffusionGemma request may hold: text only (image input comes later)."""

from __future__ import annotations

from collections.abc import Sequence

from dlrt.errors import PromptError
from dlrt.models.config import ModelConfig


def check_text_only(config: ModelConfig, ids: Sequence[int]) -> None:
    """Refuse a prompt that carries image input: the image placeholder token
    (`config.image_token_id`, 258880 in the released model) among its ids.

    Raises:
        PromptError: naming the token and where it is; the vision tower is not served.
    """
    image = config.image_token_id
    if image is None:
        return
    at = [i for i, t in enumerate(ids) if t == image]
    if at:
        raise PromptError(f"the prompt holds image input (image_token_id {image} at "
                          f"position(s) {at[:5]}): DiffusionGemma's image input is not served "
                          "yet (text only)")
