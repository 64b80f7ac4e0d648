"""What `LLM.stream` yields per decided block and what `LLM.generate` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class BlockOutput:
    """One decided block of a streamed request.

    token_ids: the block's new tokens (trimmed at a stop or `max_new_tokens`).
    text: the text they add (an incomplete UTF-8 character is held back to the next block).
    rounds: denoising rounds the block took. commit_rounds: per new token, the round
    (0-based, within the block) that committed it.
    finish_reason: None while more blocks follow; "stop" or "length" on the last one.
    """

    index: int
    token_ids: list[int]
    text: str
    rounds: int
    commit_rounds: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class GenerationResult:
    """A finished request.

    text / token_ids: the generated output, cut at `max_new_tokens` and before the first stop
    token (not included). With a stop string, `text` ends just before it and `token_ids` run
    up to the token that completes it (as vLLM's token ids).
    denoise_steps: rounds per block. commit_rounds: per output token, its round in its block.
    finish_reason: "stop" (a stop id or string) or "length". stop_reason: which stop.
    request_tps: output tokens / wall seconds from the first forward to the last block.
    timings: seconds (`first_block_s`, `total_s`), `forwards` (all forwards, prefill and
    cache writes included), `rounds` (denoising rounds), `tpf` (output tokens per round).
    """

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    denoise_steps: list[int]
    commit_rounds: list[int]
    finish_reason: str
    stop_reason: int | str | None
    request_tps: float
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
