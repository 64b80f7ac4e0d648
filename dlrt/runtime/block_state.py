"""Static device state of the block being decided: fixed shapes, allocated once per program,
so captured graphs read and write the same addresses for every block and request."""

from __future__ import annotations

from typing import NamedTuple

import torch

from dlrt.decoding.logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, unpack
from dlrt.decoding.options import DecodingParams
from dlrt.decoding.round import RoundKind, RoundSpec
from dlrt.decoding.sampling import SamplingSpec
from dlrt.decoding.schedule import round_quotas
from dlrt.decoding.strategies import StrategySpec
from dlrt.errors import NumericalError


class BlockState:
    """Buffers of a block of n positions.

    tokens [n] int64, masked [n] bool (undecided), commit_round [n] int64 (-1: not committed
    by a round), round 0-d int64 (rounds run), flag [1] int32 (1 = run another round),
    steps 0-d int64 (budget T), seed 0-d int64, quotas [n + 1] int64 (quota of round r at
    min(r, n)), lens [2] int32 (start, kv_len) of the block's forward, fault 0-d bool (a
    round met a non-finite confidence: NaN or infinite logits; read back with the tokens).
    The request's values, 0-d: temperature fp64, top_k int64, top_p fp32, threshold fp32,
    eb_threshold fp64, low_threshold fp32, credit_weight / credit_boost / credit_decay fp32,
    editing_threshold fp32 (+inf when off), max_post_steps int64 (`set_values`; compared with
    fp32 values they round as a Python float would, past the fp32 range to infinity); a
    captured round reads them (`round_spec`), so one graph serves every value.
    Credit (`credit` strategy, when built with `vocab`): credit [n, vocab] fp32, the block's
    accumulated evidence per (position, token), zeroed by `start_block`.
    Editing (LLaDA2.1): editable [n] bool (positions an edit may rewrite: those that started
    the block masked), post 0-d int64 (passes begun with no mask left), changed 0-d bool (the
    last round wrote a position).
    Logprobs (when built with `logprobs`: a round kind that records them): `logprobs`, the
    `TokenLogprobs` of the block's positions (each the record of its last write), read back
    with the tokens; None otherwise.
    """

    def __init__(self, n: int, device: torch.device, vocab: int = 0, logprobs: bool = False):
        self.n = n
        self.device = device
        self.tokens = torch.zeros(n, dtype=torch.int64, device=device)
        self.masked = torch.zeros(n, dtype=torch.bool, device=device)
        self.commit_round = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.round = torch.zeros((), dtype=torch.int64, device=device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.steps = torch.zeros((), dtype=torch.int64, device=device)
        self.seed = torch.zeros((), dtype=torch.int64, device=device)
        self.quotas = torch.zeros(n + 1, dtype=torch.int64, device=device)
        self.lens = torch.zeros(2, dtype=torch.int32, device=device)
        self.fault = torch.zeros((), dtype=torch.bool, device=device)
        self.temperature = torch.zeros((), dtype=torch.float64, device=device)
        self.top_k = torch.zeros((), dtype=torch.int64, device=device)
        self.top_p = torch.ones((), dtype=torch.float32, device=device)
        self.threshold = torch.zeros((), dtype=torch.float32, device=device)
        self.eb_threshold = torch.zeros((), dtype=torch.float64, device=device)
        self.low_threshold = torch.zeros((), dtype=torch.float32, device=device)
        self.credit_weight = torch.zeros((), dtype=torch.float32, device=device)
        self.credit_boost = torch.zeros((), dtype=torch.float32, device=device)
        self.credit_decay = torch.zeros((), dtype=torch.float32, device=device)
        self.credit = (torch.zeros(n, vocab, dtype=torch.float32, device=device) if vocab
                       else None)
        self.editing_threshold = torch.full((), float("inf"), dtype=torch.float32, device=device)
        self.max_post_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.editable = torch.zeros(n, dtype=torch.bool, device=device)
        self.post = torch.zeros((), dtype=torch.int64, device=device)
        self.changed = torch.ones((), dtype=torch.bool, device=device)
        self.logprobs = TokenLogprobs(n, device) if logprobs else None
        self._readbacks = Readbacks(device, n, logprobs)

    def tensors(self) -> list[torch.Tensor]:
        return [self.tokens, self.masked, self.commit_round, self.round, self.flag, self.steps,
                self.seed, self.quotas, self.lens, self.temperature, self.top_k, self.top_p,
                self.threshold, self.eb_threshold, self.low_threshold, self.credit_weight,
                self.credit_boost, self.credit_decay, self.editing_threshold,
                self.max_post_steps, self.editable, self.post, self.changed, self.fault,
                *([] if self.credit is None else [self.credit]),
                *([] if self.logprobs is None else self.logprobs.tensors())]

    def round_spec(self, kind: RoundKind, mask_token_id: int = -1) -> RoundSpec:
        """The round of `kind` reading this state's request values and budget (an editing
        kind never writes `mask_token_id` by an edit)."""
        strategy = StrategySpec(kind.strategy, self.threshold, self.eb_threshold,
                                self.low_threshold, self.credit_weight, self.credit_boost,
                                self.credit_decay)
        return RoundSpec(strategy,
                         SamplingSpec(self.temperature, self.top_k, self.top_p, self.seed),
                         self.steps, kind.sampling,
                         self.editing_threshold if kind.editing else None, mask_token_id,
                         kind.logprobs)

    def set_values(self, params: DecodingParams) -> None:
        """The request's sampling, strategy and editing values (host -> device, stream
        ordered)."""
        s, st = params.sampling, params.strategy
        editing = params.editing_threshold
        # NOTE: a top-k past the vocabulary keeps every token; clamped to fit int64.
        for t, v in ((self.temperature, s.temperature), (self.top_k, min(s.top_k, 2**62)),
                     (self.top_p, s.top_p), (self.threshold, st.threshold),
                     (self.eb_threshold, st.eb_threshold),
                     (self.low_threshold, st.low_threshold),
                     (self.credit_weight, st.credit_weight),
                     (self.credit_boost, st.credit_boost),
                     (self.credit_decay, st.credit_decay),
                     (self.editing_threshold, float("inf") if editing is None else editing),
                     (self.max_post_steps, params.max_post_steps)):
            t.fill_(v)

    def set_request(self, length: int, steps: int, seed: int) -> None:
        """Round budget, seed and the quotas of a block of `length` free positions."""
        # NOTE: with steps >= length the first `length` rounds commit 1 each and the rest 0,
        # as with steps == length: the quotas cost O(length) whatever the budget.
        quotas = round_quotas(length, min(steps, max(length, 1)))[: self.n] + [0]
        quotas += [0] * (self.n + 1 - len(quotas))
        self.quotas.copy_(torch.tensor(quotas, dtype=torch.int64))
        self.steps.fill_(steps)
        self.seed.fill_(seed)

    def set_lens(self, start: int, kv_len: int) -> None:
        self.lens.copy_(torch.tensor([start, kv_len], dtype=torch.int32))

    def load_block(self, tokens: list[int], masked: list[bool]) -> None:
        """The block's initial ids and undecided positions (host -> device, stream ordered);
        the positions that start masked are the editable ones."""
        self.tokens.copy_(torch.tensor(tokens, dtype=torch.int64))
        self.masked.copy_(torch.tensor(masked, dtype=torch.bool))
        self.editable.copy_(self.masked)

    def start_block(self) -> None:
        """The counters of a new block (device only): no round run, nothing committed, no
        post pass, no credit, no fault, no logprob recorded."""
        self.round.zero_()
        self.fault.zero_()
        self.commit_round.fill_(-1)
        self.post.zero_()
        self.changed.fill_(True)
        if self.credit is not None:
            self.credit.zero_()
        if self.logprobs is not None:
            self.logprobs.reset()

    def quota(self) -> torch.Tensor:
        """This round's quota, 0-d int64 (a gather: indexing by a 0-d tensor would sync)."""
        return self.quotas.gather(0, torch.clamp(self.round, max=self.n).reshape(1))[0]

    def update_flag(self, editing: bool = False) -> None:
        """Whether to run another round (device only).

        Without editing: masks remain and rounds < T. With editing (LLaDA2.1 `generate()`):
        the last round changed something (a round begun with masks always does), and masks
        remain or another post pass is allowed (post + 1 <= max_post_steps), and rounds <
        B + max_post_steps + 1 (a cap the rule above never reaches). A fault ends the block.
        """
        if not editing:
            run = self.masked.any() & (self.round < self.steps)
        else:
            cap = self.max_post_steps + (self.n + 1)
            run = (self.changed & (self.masked.any() | (self.post < self.max_post_steps))
                   & (self.round < cap))
        self.flag.copy_((run & ~self.fault).reshape(1))

    def readback_async(self) -> Readback:
        """Enqueue the copy of (tokens, commit rounds, logprobs, rounds, fault) to the host in
        stream order (into one of two pinned buffers on CUDA) and return a handle to wait on,
        so the next block can be launched before this one is read."""
        return self._readbacks.start(self.tokens, self.commit_round, self.logprobs,
                                     self.round, self.fault)


class BlockReadback(NamedTuple):
    """A block's state on the host: tokens and commit rounds per position, rounds run, and
    (with logprobs) `dlrt.decoding.logprobs.unpack`'s (logprob, top ids, top logprobs) per
    position, else None."""

    tokens: list[int]
    commit_rounds: list[int]
    rounds: int
    logprobs: tuple[list[float], list[list[int]], list[list[float]]] | None = None


class Readbacks:
    """The read-backs of the state of a block of n positions: `start(...)` packs tokens [n],
    commit rounds [n], the `TokenLogprobs` (when built with `logprobs`), rounds run and fault
    into one int64 tensor and enqueues its copy to the host, into one of two pinned buffers
    taken in turn on CUDA (a block's copy may be in flight while the next one is enqueued),
    and returns the `Readback` to wait on."""

    def __init__(self, device: torch.device, n: int, logprobs: bool = False):
        self.device, self.n, self.logprobs = device, n, logprobs
        self.size = 2 * n + 2 + (n + 2 * n * MAX_TOP_LOGPROBS if logprobs else 0)
        self._pinned: list[torch.Tensor] = []
        self._slot = 0

    def start(self, tokens: torch.Tensor, commit_rounds: torch.Tensor,
              logprobs: TokenLogprobs | None, rounds: torch.Tensor,
              fault: torch.Tensor) -> Readback:
        parts = [tokens, commit_rounds] + ([logprobs.packed()] if self.logprobs else [])
        flat = torch.cat([*parts, rounds.reshape(1).long(), fault.reshape(1).long()])
        if self.device.type != "cuda":
            return Readback(flat, None, self.n, self.logprobs)
        if not self._pinned:
            self._pinned = [torch.empty(self.size, dtype=torch.int64, pin_memory=True)
                            for _ in range(2)]
        host = self._pinned[self._slot]
        self._slot ^= 1
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Readback(host, event, self.n, self.logprobs)


class Readback:
    """A block's read-back in flight: `wait()` -> `BlockReadback`.

    Raises NumericalError (from `wait`) when a round of the block met non-finite logits."""

    def __init__(self, host: torch.Tensor, event, n: int, logprobs: bool = False):
        self.host, self.event, self.n, self.logprobs = host, event, n, logprobs

    def wait(self) -> BlockReadback:
        if self.event is not None:
            self.event.synchronize()
        n, flat = self.n, self.host
        if flat[-1]:
            raise NumericalError("the model produced non-finite logits (NaN or infinity) at a "
                                 "position being decided: the checkpoint's weights or the "
                                 "dtype's range are at fault; no tokens were accepted")
        lp = unpack(flat[2 * n: -2], n) if self.logprobs else None
        return BlockReadback(flat[:n].tolist(), flat[n: 2 * n].tolist(), int(flat[-2]), lp)
