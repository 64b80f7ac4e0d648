"""What every decoder shares: the block result, the eager round loop, the decoder registry.

A decoder turns a prompt into a stream of decided blocks. Blocks are yielded as soon as they
are decided; the caller stops pulling at a stop token or `max_new_tokens`, and work that only a
later block needs (such as writing the finished block's K/V) is deferred until it is pulled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from dlrt.decoding.options import DecoderDefaults, DecodingParams
from dlrt.decoding.round import RoundSpec, denoise_round
from dlrt.decoding.schedule import round_quotas


@dataclass
class BlockResult:
    """One decided block: its generated tokens (fixed prompt tokens excluded), the rounds it
    took, and for each generated token the round (0-based, within the block) that committed it."""

    token_ids: list[int]
    rounds: int
    commit_rounds: list[int]


class Decoder(Protocol):
    defaults: DecoderDefaults

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        """Positions the request occupies at most (checked against the context)."""
        ...

    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        ...


def round_spec(params: DecodingParams) -> RoundSpec:
    return RoundSpec(params.strategy, params.sampling, params.denoising_steps)


def run_rounds(spec: RoundSpec, logits_of: Callable[[torch.Tensor], torch.Tensor],
               tokens: torch.Tensor, masked: torch.Tensor, positions: torch.Tensor,
               block_length: int, first_logits: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Run rounds on one block until no mask is left or the budget T is spent (eager: one host
    sync per round). `first_logits` are the logits of round 0 when an earlier forward already
    produced them (look-ahead). Returns (tokens [n], commit round per position [n], rounds)."""
    quotas = round_quotas(block_length, spec.steps)
    commit_round = torch.full_like(tokens, -1)
    rounds = 0
    for r in range(spec.steps):
        if not bool(masked.any()):
            break
        logits = first_logits if (r == 0 and first_logits is not None) else logits_of(tokens)
        tokens, masked, commit = denoise_round(spec, logits, tokens, masked, positions, r,
                                               quotas[r])
        commit_round[commit] = r
        rounds += 1
    return tokens, commit_round, rounds


def block_result(tokens: torch.Tensor, commit_round: torch.Tensor, rounds: int,
                 generated: torch.Tensor) -> BlockResult:
    """Collect the generated positions (`generated` [n] bool) of a decided block (one sync)."""
    return BlockResult(tokens[generated].tolist(), rounds, commit_round[generated].tolist())
