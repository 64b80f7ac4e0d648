"""The log-likelihood of a continuation under a masked diffusion model, estimated by Monte Carlo
(LLaDA, Nie et al. 2025, eq. 6, as its `eval_llada.py` evaluates it), on the engine's runner.

For a context c and a continuation x of L tokens, one draw takes a number of masked tokens l
uniform in 1..L and l of the L positions uniformly (every subset of size l equally likely),
forwards c + x with those positions set to the mask token, and scores

    (L / l) * sum over the masked positions i of log p(x_i | c, x with the draw's masks),

the log-probabilities over the whole vocabulary in fp32. The estimate is the mean over `mc_num`
draws: an unbiased estimate of the model's lower bound on log p(x | c), deterministic for a
seed (the draws come from a CPU generator seeded by the seed and the pair's token ids, so a
pair's estimate depends neither on the device nor on the other pairs).

Families trained with full attention (LLaDA, LLaDA-MoE; dLLM-Var is LLaDA's weights) take it
over the whole continuation, every forward the whole sequence. Block-causal families (SDAR,
LLaDA2) take it block by block, blocks of the trained block length B counted from position 0:
for each block holding continuation tokens, the draws mask only those (its context tokens stay
clean), the forward is that block against the clean K/V of every position before it in the
cache (block-causal, as the model was trained), and nothing after it is present (later blocks,
positions past the continuation's end). The estimate is the sum of the blocks' estimates, each
over `mc_num` draws. Renoising families (DiffusionGemma) have no mask token: refused.

`is_greedy` (the harness's second answer): whether greedy decoding of the continuation, one
position a round, reproduces it: every round forwards the continuation's masked positions
(block-causal families: those of the current block, the blocks before it decided), takes at
each the argmax of the logits with the mask token's set to -inf, and commits the single most
confident one (the lowest position on ties), as LLaDA's `suffix_greedy_prediction` does;
the first committed token that differs from the continuation answers False.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dlrt.errors import OptionError, PromptError

MC_NUM = 128  # draws per estimate (LLaDA's eval_llada.py default)
PREFILL_CHUNK = 512  # clean positions per prefill forward at most (a multiple of B is used)


@dataclass(frozen=True)
class Unit:
    """One term of the estimate: the chunk [start, end) a forward runs (block-causal in blocks
    of `chunk_block`, or full attention when None) and the continuation's positions in it."""

    start: int
    end: int
    positions: tuple[int, ...]
    chunk_block: int | None


def units(context_len: int, total_len: int, block: int | None) -> list[Unit]:
    """The terms of a sequence of `total_len` tokens whose first `context_len` are context:
    one over the whole sequence (`block` None: full attention), else one per block of `block`
    positions that holds continuation tokens (the last one cut at `total_len`)."""
    if context_len >= total_len:
        return []
    if block is None:
        return [Unit(0, total_len, tuple(range(context_len, total_len)), None)]
    first = context_len // block * block
    return [Unit(s, min(s + block, total_len),
                 tuple(range(max(s, context_len), min(s + block, total_len))), block)
            for s in range(first, total_len, block)]


def draw(positions: Sequence[int], generator: torch.Generator) -> list[int]:
    """One draw's masked positions: l uniform in 1..len(positions), then l of them uniformly
    (sorted)."""
    n = len(positions)
    count = int(torch.randint(1, n + 1, (), generator=generator))
    picked = torch.randperm(n, generator=generator)[:count]
    return sorted(positions[i] for i in picked.tolist())


def pair_seed(seed: int, context: Sequence[int], continuation: Sequence[int]) -> int:
    """A generator seed for one (context, continuation) pair: the estimator's seed and the
    pair's token ids, hashed (the same in every process and on every machine)."""
    text = f"{seed}|{','.join(map(str, context))}|{','.join(map(str, continuation))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class Scorer:
    """The forwards of one (context, continuation) pair on a `ModelRunner`.

    runner: the engine's runner (one sequence per forward; its KV cache is scratch between
        requests). ids: context + continuation token ids; `context_len` of them context.
    block: the block length of a block-causal family, None for full attention.
    """

    def __init__(self, runner, mask_token_id: int, ids: Sequence[int], context_len: int,
                 block: int | None):
        self.runner = runner
        self.mask_token_id = mask_token_id
        self.block = block
        self.tokens = torch.tensor(list(ids), dtype=torch.int64, device=runner.device)  # [N]
        self.units = units(context_len, len(ids), block)
        self._clean = 0  # the cache holds the clean K/V of positions [0, _clean)
        self.forwards = 0  # forwards run so far

    def _prefix(self, start: int) -> None:
        """Make the cache hold the clean K/V of positions [0, start) (block-causal forwards in
        whole blocks, a chunk at a time)."""
        b = self.block
        step = max(b, PREFILL_CHUNK // b * b)
        for lo in range(self._clean, start, step):
            hi = min(lo + step, start)
            self.runner.forward_at(self.tokens[lo:hi], lo, chunk_block=b, rows=None)
            self.forwards += 1
        self._clean = max(self._clean, start)

    @torch.inference_mode()
    def logits(self, unit: Unit, masked: Sequence[int]) -> torch.Tensor:
        """Logits [len(masked), V] (fp32) at the `masked` positions (absolute, a subset of
        `unit.positions`) of the unit's chunk with those positions set to the mask token."""
        if unit.chunk_block is not None:
            self._prefix(unit.start)
        rows = torch.tensor([p - unit.start for p in masked], dtype=torch.int64,
                            device=self.tokens.device)
        chunk = self.tokens[unit.start:unit.end].clone()
        chunk[rows] = self.mask_token_id
        logits = self.runner.forward_at(chunk, unit.start, unit.chunk_block, rows=rows)
        self.forwards += 1
        if unit.chunk_block is not None:
            # NOTE: the chunk's K/V (masked) now sit at its positions: the cache is clean before it
            self._clean = min(self._clean, unit.start)
        return logits.float()

    @torch.inference_mode()
    def logprob(self, unit: Unit, masked: Sequence[int]) -> float:
        """Sum over `masked` of log p(the continuation's token) under the forward with those
        positions masked (log-softmax over the whole vocabulary, fp32)."""
        logp = torch.log_softmax(self.logits(unit, masked), dim=-1)  # [l, V]
        target = self.tokens[list(masked)]
        return float(logp.gather(1, target[:, None]).sum(dtype=torch.float64))

    @torch.inference_mode()
    def is_greedy(self) -> bool:
        """Whether greedy decoding, one position a round (the most confident; mask token
        excluded), reproduces the continuation (units in order, the earlier ones decided)."""
        for unit in self.units:
            masked = list(unit.positions)
            while masked:
                logits = self.logits(unit, masked)  # [m, V]
                logits[:, self.mask_token_id] = -torch.inf
                p, token = torch.softmax(logits, dim=-1).max(dim=-1)
                i = int(p.argmax())  # NOTE: argmax takes the first maximum: the lowest position
                if int(token[i]) != int(self.tokens[masked[i]]):
                    return False
                del masked[i]
        return True


def estimate(scorer: Scorer, mc_num: int, generator: torch.Generator) -> float:
    """The Monte-Carlo estimate of log p(continuation | context): per unit, the mean over
    `mc_num` draws of (L / l) * the draw's `logprob`, summed over the units (last unit first:
    its draws leave the clean K/V before it in the cache for the units before it)."""
    total = 0.0
    for unit in reversed(scorer.units):
        n = len(unit.positions)
        acc = 0.0
        for _ in range(mc_num):
            masked = draw(unit.positions, generator)
            acc += n / len(masked) * scorer.logprob(unit, masked)
        total += acc / mc_num
    return total


class LikelihoodEstimator:
    """Log-likelihoods of continuations on a loaded `LLM`.

    mc_num: draws per estimate (per block for block-causal families), >= 1.
    seed: the draws' seed, >= 0. check_greedy: compute `is_greedy` (False: always False,
        LLaDA's `is_check_greedy=False`, which saves up to L forwards a pair).

    Raises:
        OptionError: a bad `mc_num` or `seed`; a family without a mask token (renoising
            diffusion: DiffusionGemma); tensor parallelism (the logits are cut across ranks).
    """

    def __init__(self, llm, mc_num: int = MC_NUM, seed: int = 0, check_greedy: bool = True):
        from dlrt.models.registry import family

        if isinstance(mc_num, bool) or not isinstance(mc_num, int) or mc_num < 1:
            raise OptionError(f"mc_num must be an integer >= 1, got {mc_num!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise OptionError(f"seed must be an integer in [0, 2^63), got {seed!r}")
        fam = family(llm.config.family)
        if llm.config.mask_token_id is None or fam.attention not in ("full", "block_causal"):
            raise OptionError(
                f"loglikelihood is not defined for {fam.name} models: they have no mask token "
                "(uniform-state renoising diffusion), and the masked-diffusion estimator "
                "needs one; generate_until tasks work")
        if llm.runner.vocab is not None:
            raise OptionError("loglikelihood with tensor parallelism is not built (each rank "
                              "holds a shard of the logits); run it with one rank")
        self.llm = llm
        self.mc_num = mc_num
        self.seed = seed
        self.check_greedy = check_greedy
        self.block = llm.engine.resolved.block_length if fam.attention == "block_causal" \
            else None
        self.forwards = 0  # forwards run so far, over every pair

    def scorer(self, context: Sequence[int], continuation: Sequence[int]) -> Scorer:
        """A `Scorer` of the pair on the LLM's runner.

        Raises:
            PromptError: context + continuation longer than the model's context.
        """
        n, limit = len(context) + len(continuation), self.llm.max_model_len
        if n > limit:
            raise PromptError(f"context + continuation ({n} tokens) do not fit the context of "
                              f"{limit} tokens")
        return Scorer(self.llm.runner, self.llm.config.mask_token_id,
                      [*context, *continuation], len(context), self.block)

    def loglikelihood(self, context: Sequence[int], continuation: Sequence[int]
                      ) -> tuple[float, bool]:
        """(estimate of log p(continuation | context), is_greedy) for token ids; an empty
        continuation is (0.0, True).

        Raises:
            PromptError: as `scorer`.
        """
        scorer = self.scorer(context, continuation)
        generator = torch.Generator().manual_seed(pair_seed(self.seed, context, continuation))
        value = estimate(scorer, self.mc_num, generator)
        greedy = scorer.is_greedy() if self.check_greedy else False
        self.forwards += scorer.forwards
        return value, greedy
