"""What every decoder shares: the block result, the program interface, the decoder protocol.

A decoder turns a prompt into a stream of decided blocks. The work of one block is a *program*:
a begin phase (prepare the block; programs name theirs in `phases`), `round` (one forward +
commit), `end` (after the last round), pure tensor code on the program's static `BlockState`,
run by an `Executor` eagerly, as graphs replayed from the host, or as one CUDA graph whose
WHILE node repeats `round` on the device. A program serves every request of its round kind:
the request's values live in its state's device memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from dlrt.attention.base import AttentionSpan
from dlrt.decoding.options import DecoderDefaults, DecodingParams
from dlrt.decoding.round import RoundKind, RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingMode
from dlrt.decoding.strategies import NEEDS_CREDIT
from dlrt.models.family import Family
from dlrt.outputs import TokenLogprob, TopLogprob
from dlrt.runtime.block_state import BlockReadback, BlockState

MAX_PROGRAMS = 8  # programs (and their captured graphs) a decoder keeps, least recent dropped


@dataclass
class BlockResult:
    """One decided block: its generated tokens (fixed prompt tokens excluded), the rounds it
    took, for each generated token the round (0-based, within the block) that wrote it last,
    the forwards it ran besides its rounds (prefill, final K/V write, look-ahead), and, when
    the request asked for them, each generated token's `TokenLogprob`."""

    token_ids: list[int]
    rounds: int
    commit_rounds: list[int]
    extra_forwards: int = 0
    logprobs: list[TokenLogprob] | None = None


class Program(Protocol):
    state: BlockState
    key: tuple  # identifies the program (and so its captured graphs)
    phases: dict[str, Callable[[], None]]  # begin phase name -> its function

    def round(self) -> None: ...

    def end(self) -> None: ...

    def buffers(self) -> list[torch.Tensor]:
        """Every device buffer the program mutates (saved around the warm-up before capture)."""
        ...

    def spans(self, start: int, kv_len: int, phase: str | None) -> list[AttentionSpan]:
        """The forwards of one block launched with `state.lens == (start, kv_len)` and begin
        `phase` (None: its rounds only), for backends that plan on the host."""
        ...


class Decoder(Protocol):
    defaults: DecoderDefaults
    padding: str  # what the positions past prompt + max_new_tokens are (context errors)

    def max_positions(self, prompt_len: int, params: DecodingParams) -> int:
        """Cache positions the request may touch (checked against the context)."""
        ...

    def decode(self, prompt: list[int], params: DecodingParams) -> Iterator[BlockResult]:
        ...


def round_kind(params: DecodingParams) -> RoundKind:
    """The round kind of a request: its strategy, sampling mode, whether it edits and whether
    it records logprobs (values excluded)."""
    return RoundKind(params.strategy.name, SamplingMode.of(params.sampling),
                     params.editing_threshold is not None, params.logprobs)


class ProgramBase:
    """What programs share: the runner, a `BlockState` of B positions (with a [B, V] credit
    buffer for the `credit` strategy, and logprob buffers for a kind that records them), the
    round spec reading the state's request values, the key (`name`, B, extra key parts, round
    kind), and a block of mask tokens when given. Default `buffers`: the block state. Programs
    call `state.start_block()` when a block starts."""

    def __init__(self, name: str, runner, kind: RoundKind, b: int, *key: object,
                 mask_token_id: int | None = None):
        self.runner, self.b, self.kind = runner, b, kind
        vocab = runner.model.config.vocab_size if kind.strategy in NEEDS_CREDIT else 0
        self.state = BlockState(b, runner.device, vocab, kind.logprobs)
        self.spec: RoundSpec = self.state.round_spec(
            kind, -1 if mask_token_id is None else mask_token_id)
        self.key = (name, b, *key, kind)
        if mask_token_id is not None:
            self.mask_block = torch.full((b,), mask_token_id, dtype=torch.int64,
                                         device=runner.device)

    def buffers(self) -> list[torch.Tensor]:
        return self.state.tensors()

    def commit(self, logits: torch.Tensor, positions: torch.Tensor,
               rows: torch.Tensor | None = None,
               canvas: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Apply one round's commit (and, in an editing kind, its edits) to the state from
        `logits` [n, V] (device only); a position's commit round is the round of its last
        write. An editing round begun with no mask left is a post pass (`state.post`).

        With `canvas=(ids, masked)` the block is the window `rows` of a larger canvas, whose
        ids and mask are updated in place; otherwise the state's own tokens/masked are.
        """
        state, editing = self.state, self.kind.editing
        if canvas is None:
            tokens, masked = state.tokens, state.masked
        else:
            tokens, masked = canvas[0].index_select(0, rows), canvas[1].index_select(0, rows)
        if editing:
            state.post.add_((~masked.any()).long())
        op = self.runner.ops.candidates
        if self.runner.vocab is not None:  # a vocabulary-parallel head: this rank's logits
            logits, op = self.runner.vocab.for_round(logits, self.kind, op)
        new_tokens, new_masked, commit = denoise_round(
            self.spec, logits, tokens, masked, positions, state.round, state.quota(),
            candidates_op=op, editable=state.editable,
            credit=state.credit, fault=state.fault, logprobs=state.logprobs)
        if canvas is None:
            state.tokens.copy_(new_tokens)
            state.masked.copy_(new_masked)
        else:
            canvas[0].index_copy_(0, rows, new_tokens)
            canvas[1].index_copy_(0, rows, new_masked)
            state.masked.copy_(new_masked)
        state.commit_round.copy_(torch.where(commit, state.round, state.commit_round))
        if editing:
            state.changed.copy_(commit.any())
        state.round.add_(1)
        state.update_flag(editing)


class DecoderBase:
    """What decoders hold: the runner, the executor, and their programs by key, at most
    `MAX_PROGRAMS` (a program owns static buffers that its captured graphs point at; the least
    recently used one is dropped together with its graphs).

    `name` is the `decoder` option's value; `attention` the attention pattern of its forwards
    ("block_causal": causal across blocks; "full": every position of a forward sees every
    other), which a family must have been trained with (`Family.attention`). `supports` says
    which families it fits; the registry (`dlrt.runtime.decoders`) asks it."""

    name = "base"
    attention = "block_causal"

    @classmethod
    def supports(cls, family: Family) -> str | None:
        """None when the decoder fits a model of `family`; else the reason it does not."""
        if family.attention != cls.attention:
            return (f"decoder {cls.name!r} does not fit a {family.name} model: its forwards "
                    f"use {cls.attention} attention, the model was trained with "
                    f"{family.attention} attention")
        return None

    def __init__(self, runner, mask_token_id: int, defaults: DecoderDefaults, executor):
        self.runner = runner
        self.mask_token_id = mask_token_id
        self.defaults = defaults
        self.executor = executor
        self._programs: OrderedDict[tuple, Program] = OrderedDict()

    def cached_program(self, key: tuple, make: Callable[[], Program]) -> Program:
        if key in self._programs:
            self._programs.move_to_end(key)
        else:
            while len(self._programs) >= MAX_PROGRAMS:
                _, old = self._programs.popitem(last=False)
                self.executor.forget(old)
            self._programs[key] = make()
        return self._programs[key]

    def release(self) -> None:
        """Drop every program, with its state buffers and captured graphs (`LLM.sleep`);
        they are made again when a request needs them."""
        while self._programs:
            self.executor.forget(self._programs.popitem(last=False)[1])

    @property
    def programs(self) -> list[Program]:
        """The programs kept now, least recently used first."""
        return list(self._programs.values())


def run_blocks(executor, state: BlockState, launch: Callable[[int], None],
               n_blocks: int) -> Iterator[BlockReadback]:
    """Run blocks 0..n_blocks-1 (`launch(k)` enqueues block k) and yield each one's read-back
    (`BlockReadback`: tokens, commit rounds, rounds run, logprobs), in order.

    In the graph modes block k+1 is launched before block k is read back: the host's work
    between blocks (launch, read-back, detokenisation, streaming) overlaps the GPU's next
    block, and a block's state never waits on the host. A consumer that stops early (a stop
    id) leaves at most one launched block, whose positions are scratch. Eager mode runs the
    blocks one after the other (nothing to overlap), and so does a host-planned attention
    backend (`Executor.launches_ahead`).
    """
    ahead = executor.launches_ahead
    launch(0)
    pending = state.readback_async()
    for k in range(n_blocks):
        following = None
        if ahead and k + 1 < n_blocks:
            launch(k + 1)
            following = state.readback_async()
        result = pending.wait()
        yield result
        if k + 1 < n_blocks:
            if following is None:
                launch(k + 1)
                following = state.readback_async()
            pending = following


def block_result(readback: BlockReadback, top_logprobs: int = 0, skip: int = 0,
                 keep: int | None = None, extra_forwards: int = 0) -> BlockResult:
    """The generated positions skip..keep of a read-back block, with (when read back) each
    one's logprob and its first `top_logprobs` alternatives of probability above 0."""
    tokens, commit_rounds, rounds, lp = readback
    end = len(tokens) if keep is None else keep
    logprobs = None
    if lp is not None:
        chosen, top_ids, top = lp
        logprobs = [TokenLogprob(tokens[i], chosen[i], [
            TopLogprob(t, v) for t, v in zip(top_ids[i][:top_logprobs], top[i][:top_logprobs],
                                             strict=True) if v != float("-inf")])
            for i in range(skip, end)]
    return BlockResult(tokens[skip:end], rounds, commit_rounds[skip:end], extra_forwards,
                       logprobs)
