"""What `LLM.stream` yields per decided block and what `LLM.generate` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TopLogprob:
    """An alternative at a position: a token id and its log-probability (natural log)."""

    token_id: int
    logprob: float


@dataclass
class TokenLogprob:
    """The log-probability (natural log, fp32 on the device) of a generated token under the
    distribution its round drew it from (`dlrt.decoding.logprobs`), and the `top_logprobs`
    most likely tokens of that distribution, most likely first (only tokens it gives a
    probability above 0: fewer when top-k / top-p leave fewer)."""

    token_id: int
    logprob: float
    top_logprobs: list[TopLogprob] = field(default_factory=list)


@dataclass
class BlockOutput:
    """One decided block of a streamed request.

    token_ids: the block's new tokens (trimmed at a stop or `max_new_tokens`).
    text: the text they add (an incomplete UTF-8 character is held back to the next block).
    rounds: denoising rounds the block took. commit_rounds (also `step_map`): per new token,
    the round (0-based, within the block) of its last write (an edit's round where one
    rewrote it; a renoising canvas's last round).
    finish_reason: None while more blocks follow; "stop" or "length" on the last one.
    logprobs: per new token, its `TokenLogprob` (with the request's `logprobs=True`), else None.
    """

    index: int
    token_ids: list[int]
    text: str
    rounds: int
    commit_rounds: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def step_map(self) -> list[int]:
        """Per new token, the round of its block that wrote it last (`commit_rounds`)."""
        return self.commit_rounds


@dataclass
class GenerationResult:
    """A finished request.

    text / token_ids: the generated output, cut at `max_new_tokens` and before the first stop
    token (not included). With a stop string, `text` ends just before it and `token_ids` run
    up to the token that completes it (as vLLM's token ids).
    denoise_steps: rounds per block. commit_rounds (also `step_map`, the name of RL
    rollouts): per output token, the round (0-based, within its block or canvas) of its last
    write: the round that committed it, or that rewrote it last (LLaDA2.1 token editing), or
    a renoising canvas's last round (DiffusionGemma commits the argmax canvas of its last
    round).
    logprobs: per output token, its `TokenLogprob` when the request set `logprobs=True` (with
    `top_logprobs` alternatives each), else None.
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
    logprobs: list[TokenLogprob] | None = None

    @property
    def step_map(self) -> list[int]:
        """Per output token, the round of its block that wrote it last (`commit_rounds`)."""
        return self.commit_rounds

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON types, `step_map` included."""
        return {**asdict(self), "step_map": list(self.step_map)}
