"""Greedy decoding through dlrt's block loops equals naive decoders written here.

The naive decoders follow DESIGN §3 with no KV cache and no shortcuts:
- SDAR (JetAstra/SDAR `generate.py` semantics): every round recomputes the whole sequence
  [prompt + finished blocks + current block] with the block-causal mask (our model's forward
  over one chunk from position 0, nothing cached) and commits in the current block.
- LLaDA canvas (ML-GSAI/LLaDA `generate.py`): every round recomputes the whole canvas
  [prompt + generation region] with full attention; commits only in the current sub-block.
- dLLM-Var (maomaocun/dLLM-Var `generate_function.py`): explicit per-layer K/V lists. The
  prompt is forwarded with the first mask block and only the prompt's K/V are kept; a finished
  block is forwarded with the next mask block and only its K/V are kept (so cached K/V saw
  exactly one following block of masks); rounds forward the block against the kept K/V.
The LLaDA forward used by the naive decoders is written here from the weights (RMSNorm, RoPE,
attention, SwiGLU), independent of dlrt's attention backend, cache and layers.

Models run in float64 and the lm_head is scaled by SHARPEN so the distributions are peaked
(max p ~0.1-0.9 instead of ~1e-5 over a 150k vocabulary): every strategy's threshold then
decides something, and ties between positions are far above the numeric noise (~1e-13).
Tokens, rounds per block and commit rounds must be identical.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dlrt.attention.base import ForwardContext, ForwardMeta
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.registry import get_backend
from dlrt.llm import LLM

SHARPEN = 50.0
SDAR_MASK, SDAR_STOP = 151669, frozenset({151645, 151643})  # DESIGN §1, §3.4
LLADA_MASK, LLADA_STOP = 126336, frozenset({126081, 126348})
PROMPT_IDS = [9707, 11, 1879, 0, 4021, 315, 279, 1879, 525, 1632, 13]


@dataclass(frozen=True)
class Strategy:
    name: str
    threshold: float = 0.9
    eb_threshold: float = 0.35
    low_threshold: float = 0.4  # hierarchical; then dInfer's credit defaults
    credit_weight: float = 0.7
    credit_boost: float = 0.2
    credit_decay: float = 0.8

    def options(self) -> dict:
        return dict(remasking_strategy=self.name, threshold=self.threshold,
                    eb_threshold=self.eb_threshold, low_threshold=self.low_threshold,
                    credit_weight=self.credit_weight, credit_boost=self.credit_boost,
                    credit_decay=self.credit_decay)


# Thresholds chosen inside the range of the sharpened confidences / entropies, so the
# strategies commit varying counts per round (not always one, not always all).
STRATEGIES = {
    "sequential": Strategy("sequential"),
    "low_confidence_static": Strategy("low_confidence_static"),
    "low_confidence_dynamic": Strategy("low_confidence_dynamic", threshold=0.6),
    "threshold": Strategy("threshold", threshold=0.5),
    "dynamic_pmax": Strategy("dynamic_pmax", threshold=0.2),
    "entropy_bounded": Strategy("entropy_bounded", eb_threshold=3.0),
    "credit": Strategy("credit", threshold=0.6),
    "hierarchical": Strategy("hierarchical", threshold=0.7, low_threshold=0.3),
}
QUOTA = {"sequential", "low_confidence_static"}  # commit exactly the clamped quota


# ---------------------------------------------------------------------------- naive rounds


def quotas(n: int, steps: int) -> list[int]:
    """DESIGN §1: n split evenly over the rounds, the first n mod T rounds one more."""
    return [n // steps + (1 if r < n % steps else 0) for r in range(steps)]


def pick(s: Strategy, p: list[float], ent: list[float], masked: list[int], k: int) -> list[int]:
    """DESIGN §3.6 on plain lists; ties go to the lower index."""
    by_p = sorted(masked, key=lambda i: (-p[i], i))
    if s.name == "sequential":
        return sorted(masked)[:k]
    if s.name == "low_confidence_static":
        return by_p[:k]
    if s.name == "low_confidence_dynamic":
        high = [i for i in masked if p[i] > s.threshold]
        return high if len(high) >= k else by_p[:k]
    if s.name == "threshold":  # LLaDA2 `generate()`: p > threshold, else the top one
        return [i for i in masked if p[i] > s.threshold] or by_p[:1]
    if s.name == "dynamic_pmax":
        count, prod = 0, 1.0
        for i in by_p:
            prod *= p[i]
            if prod < s.threshold:
                break
            count += 1
        return by_p[:max(count, 1)]
    if s.name == "credit":  # dInfer: fused p >= threshold, else the most confident
        return [i for i in masked if p[i] >= s.threshold] or by_p[:1]
    if s.name == "hierarchical":  # dInfer `HierarchyDecoder`
        chosen = {i for i in masked if p[i] > s.threshold} | set(by_p[:1])
        spans: list[list[int]] = []
        for i in sorted(masked):
            if spans and spans[-1][-1] == i - 1:
                spans[-1].append(i)
            else:
                spans.append([i])
        for span in spans:
            best = min(span, key=lambda i: (-p[i], i))
            if p[best] > s.low_threshold:
                chosen.add(best)
        return sorted(chosen)
    if s.name == "entropy_bounded":
        by_h = sorted(masked, key=lambda i: (ent[i], i))
        count, total = 0, 0.0
        for i in by_h:
            total += ent[i]
            if total >= s.eb_threshold:
                break
            count += 1
        return by_h[:max(count, 1)]
    raise AssertionError(s.name)


def denoise(block: list[int], fixed: int, steps: int, s: Strategy, logits_of, mask_id: int,
            first_logits: torch.Tensor | None = None) -> tuple[list[int], int, list[int]]:
    """Rounds on one block (positions < `fixed` are prompt tokens, never masked). logits_of()
    returns [len(block), V] logits for the current `block`. Returns (tokens, rounds, commit
    round per position)."""
    block = list(block)
    masked = list(range(fixed, len(block)))
    commit = [-1] * len(block)
    q = quotas(len(block), steps)
    rounds = 0
    credit = torch.zeros(0)
    for r in range(steps):
        if not masked:
            break
        logits = first_logits if r == 0 and first_logits is not None else logits_of(block)
        if s.name == "credit":  # dInfer's credit: decay, add p ** boost at the argmax, fuse
            logits = logits.double()
            credit = credit * s.credit_decay if r else torch.zeros_like(logits)
            top_p, top = torch.softmax(logits, dim=-1).max(dim=-1)
            for i in masked:
                credit[i, top[i]] += top_p[i] ** s.credit_boost
            logits = logits + s.credit_weight * torch.log(1 + credit)
        probs = torch.softmax(logits.double(), dim=-1)
        p, cand = (v.tolist() for v in probs.max(dim=-1))
        ent = (-torch.special.xlogy(probs, probs).sum(dim=-1)).tolist() \
            if s.name == "entropy_bounded" else None
        chosen = masked if r == steps - 1 else pick(s, p, ent, masked, min(max(q[r], 1),
                                                                           len(masked)))
        for i in chosen:
            block[i], commit[i] = cand[i], r
        masked = [i for i in masked if i not in chosen]
        rounds += 1
    assert mask_id not in block[fixed:]
    return block, rounds, commit


@dataclass
class Block:
    """One decided block of a naive decoder: its generated tokens (fixed prompt tokens
    excluded), rounds, commit round per generated token, and its length (the quota base)."""

    tokens: list[int]
    rounds: int
    commits: list[int]
    length: int


def decided(block: list[int], fixed: int, rounds: int, commit: list[int]) -> Block:
    return Block(block[fixed:], rounds, commit[fixed:], len(block))


def trim(blocks: list[Block], max_new: int, stop: frozenset[int]):
    """DESIGN §3.4 on the untrimmed blocks: (tokens, rounds per block, commit rounds)."""
    tokens = [t for b in blocks for t in b.tokens][:max_new]
    commits = [c for b in blocks for c in b.commits][:max_new]
    cut = next((i for i, t in enumerate(tokens) if t in stop), len(tokens))
    return tokens[:cut], [b.rounds for b in blocks], commits[:cut]


def done(blocks: list[Block], max_new: int, stop: frozenset[int]) -> bool:
    return (sum(len(b.tokens) for b in blocks) >= max_new
            or any(t in stop for t in blocks[-1].tokens))


# ---------------------------------------------------------------------------- naive decoders


def sdar_logits(llm: LLM, seq: list[int], b: int, lo: int) -> torch.Tensor:
    """Logits of seq[lo:] from one forward of the whole `seq` from position 0, block-causal
    with blocks of b, through a fresh scratch cache (nothing reused between forwards)."""
    n, c = len(seq), llm.config
    ids, positions = torch.tensor(seq, dtype=torch.int64), torch.arange(n)
    cache = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, n, llm.dtype, "cpu")
    meta = ForwardMeta(positions, torch.tensor([0, n], dtype=torch.int32), b)
    ctx = ForwardContext(get_backend("sdpa", cache, c.num_heads), meta, cache)
    with torch.inference_mode():
        hidden = llm.model(ids, positions, ctx)
        return llm.model.logits(hidden[lo:])


def naive_sdar(llm: LLM, prompt: list[int], b: int, steps: int, s: Strategy, max_new: int,
               stop: frozenset[int]) -> list[Block]:
    start = len(prompt) // b * b
    seq, fixed = list(prompt[:start]), list(prompt[start:])
    blocks = []
    while True:
        block = fixed + [SDAR_MASK] * (b - len(fixed))
        block, rounds, commit = denoise(
            block, len(fixed), steps, s,
            lambda blk, seq=seq, start=start: sdar_logits(llm, seq + blk, b, start), SDAR_MASK)
        blocks.append(decided(block, len(fixed), rounds, commit))
        if done(blocks, max_new, stop):
            return blocks
        seq, start, fixed = seq + block, start + b, []


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    # NOTE: angles and rotation in fp32, as LLaDA's `rope_full_precision` (and dlrt) do.
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)[:, None, :]
    xf = x.float()
    rot = torch.cat([-xf[..., d // 2:], xf[..., :d // 2]], dim=-1)
    return (xf * ang.cos() + rot * ang.sin()).to(x.dtype)


def llada_forward(llm: LLM, tokens: list[int], past: list | None, rows: slice = slice(None)):
    """LLaDA written out from its weights. Full attention of `tokens` (at positions after the
    past) over past K/V + themselves. Returns (logits of tokens[rows], per-layer (K, V) of
    past + tokens)."""
    c, t = llm.config, llm.model.model.transformer
    n, d = len(tokens), c.head_dim
    start = 0 if past is None else past[0][0].shape[0]
    pos = torch.arange(start, start + n)
    x = t.wte.weight[torch.tensor(tokens)]
    kv = []
    for i, blk in enumerate(t.blocks):
        h = _rms(x, blk.attn_norm.weight, c.rms_norm_eps)
        q = _rope((h @ blk.qkv.part("q_proj").T).view(n, -1, d), pos, c.rope_theta)
        k = _rope((h @ blk.qkv.part("k_proj").T).view(n, -1, d), pos, c.rope_theta)
        v = (h @ blk.qkv.part("v_proj").T).view(n, -1, d)
        if past is not None:
            k, v = torch.cat([past[i][0], k]), torch.cat([past[i][1], v])
        kv.append((k, v))
        g = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(d), dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", att, vv).reshape(n, -1) @ blk.attn_out.weight.T
        h = _rms(x, blk.ff_norm.weight, c.rms_norm_eps)
        gate = torch.nn.functional.silu(h @ blk.ff_gate_up.part("ff_proj").T)
        x = x + (gate * (h @ blk.ff_gate_up.part("up_proj").T)) @ blk.ff_out.weight.T
    x = _rms(x, t.ln_f.weight, c.rms_norm_eps)
    return x[rows] @ t.ff_out.weight.T, kv


def naive_canvas(llm: LLM, prompt: list[int], b: int, steps: int, s: Strategy, max_new: int,
                 stop: frozenset[int]) -> list[Block]:
    canvas = list(prompt) + [LLADA_MASK] * max_new
    blocks = []
    for lo in range(len(prompt), len(canvas), b):
        hi = min(lo + b, len(canvas))

        def logits_of(blk, lo=lo, hi=hi):
            return llada_forward(llm, canvas[:lo] + blk + canvas[hi:], None, slice(lo, hi))[0]

        block, rounds, commit = denoise(canvas[lo:hi], 0, steps, s, logits_of, LLADA_MASK)
        canvas[lo:hi] = block
        blocks.append(decided(block, 0, rounds, commit))
        if done(blocks, max_new, stop):
            break
    return blocks


def _keep_head(kv: list, n: int) -> list:
    return [(k[:n], v[:n]) for k, v in kv]


def naive_dllm_var(llm: LLM, prompt: list[int], b: int, steps: int, s: Strategy, max_new: int,
                   stop: frozenset[int]) -> list[Block]:
    mask_block = [LLADA_MASK] * b
    logits, kv = llada_forward(llm, list(prompt) + mask_block, None, slice(-b, None))
    past = _keep_head(kv, len(prompt))  # the prompt's K/V, computed seeing one mask block
    blocks = []
    while True:
        block, rounds, commit = denoise(
            mask_block, 0, steps, s, lambda blk, past=past: llada_forward(llm, blk, past)[0],
            LLADA_MASK, first_logits=logits)
        blocks.append(decided(block, 0, rounds, commit))
        if done(blocks, max_new, stop):
            return blocks
        # Look-ahead: the finished block's K/V are computed seeing the next mask block.
        logits, kv = llada_forward(llm, block + mask_block, past, slice(b, None))
        past = _keep_head(kv, past[0][0].shape[0] + b)


# ---------------------------------------------------------------------------- fixtures


def _weights_only(src: Path, dst: Path) -> Path:
    """A view of a checkpoint without tokenizer files (they take seconds to load)."""
    dst.mkdir(parents=True)
    for name in ("model.safetensors", "generation_config.json", "config.json"):
        os.symlink(src / name, dst / name)
    return dst


def _sharpen(llm: LLM) -> LLM:
    head = llm.model.lm_head if hasattr(llm.model, "lm_head") else \
        llm.model.model.transformer.ff_out
    head.weight.mul_(SHARPEN)
    return llm


@pytest.fixture(scope="module")
def sdar_llms(tmp_path_factory, tiny_sdar, tiny_sdar_moe):
    root = tmp_path_factory.mktemp("decode")
    return {name: _sharpen(LLM(_weights_only(src, root / name), dtype="float64", device="cpu"))
            for name, src in (("sdar", tiny_sdar), ("sdar_moe", tiny_sdar_moe))}


@pytest.fixture(scope="module")
def llada_llms(tiny_llada):
    return {dec: _sharpen(LLM(tiny_llada, dtype="float64", device="cpu", decoder=dec))
            for dec in ("canvas", "dllm_var")}


# ---------------------------------------------------------------------------- checks


def check_rounds(result, blocks: list[Block], steps: int, s: Strategy) -> None:
    """dlrt's rounds and commit rounds are consistent with the budget T and the quotas."""
    assert len(result.denoise_steps) == len(blocks)
    offset = 0
    for blk, rounds in zip(blocks, result.denoise_steps, strict=True):
        size = len(blk.tokens)
        assert 1 <= rounds <= steps
        commits = result.commit_rounds[offset:offset + size]
        offset += size
        assert all(0 <= c < rounds for c in commits)
        if len(commits) < size:  # the trimmed last block
            break
        counts = [commits.count(r) for r in range(rounds)]
        assert min(counts) >= 1  # every round commits at least one position
        left, q = size, quotas(blk.length, steps)
        for r, count in enumerate(counts):
            k = min(max(q[r], 1), left)
            if r == steps - 1:
                assert count == left  # the last round of the budget commits every mask
            elif s.name in QUOTA:
                assert count == k
            elif s.name == "low_confidence_dynamic":
                assert count >= k
            left -= count
        assert left == 0
        if s.name == "sequential":
            assert commits == sorted(commits)


def compare(llm: LLM, blocks: list[Block], prompt, b, steps, s, max_new, stop_ids, **extra):
    """dlrt's greedy generation equals the naive blocks: tokens, rounds, commit rounds."""
    result = llm.generate(list(prompt), max_new_tokens=max_new, temperature=0.0,
                          block_length=b, denoising_steps=steps, **s.options(), **extra)
    tokens, rounds, commits = trim(blocks, max_new, stop_ids)
    assert result.token_ids == tokens
    assert result.denoise_steps == rounds
    assert result.commit_rounds == commits
    check_rounds(result, blocks, steps or blocks[0].length, s)
    return result


# ---------------------------------------------------------------------------- tests

# (model, strategy, prompt length P, block length B, denoising steps T): every strategy on the
# dense model with B = 4 and 8, P < B, P = B, P not a multiple of B, T = B, T < B (quotas > 1,
# uneven) and T > B (quota 0 clamped to 1); B = 1; the MoE model (B = 4: experts gathered per
# (token, expert) pair, B = 8 and the naive whole sequence: per-expert loop) on a subset.
SDAR_CASES = [
    ("sdar", "sequential", 1, 8, 3), ("sdar", "sequential", 9, 4, 4),
    ("sdar", "low_confidence_static", 7, 8, 5), ("sdar", "low_confidence_static", 4, 4, 2),
    ("sdar", "low_confidence_dynamic", 9, 8, 8), ("sdar", "low_confidence_dynamic", 1, 4, 4),
    ("sdar", "low_confidence_dynamic", 4, 8, 3),
    ("sdar", "threshold", 4, 8, 8), ("sdar", "threshold", 7, 4, 6),
    ("sdar", "dynamic_pmax", 9, 8, 3), ("sdar", "dynamic_pmax", 4, 4, 4),
    ("sdar", "entropy_bounded", 7, 8, 8), ("sdar", "entropy_bounded", 1, 4, 4),
    ("sdar", "low_confidence_static", 7, 1, 1),
    ("sdar_moe", "low_confidence_dynamic", 7, 8, 8), ("sdar_moe", "low_confidence_static", 9, 4, 2),
    ("sdar_moe", "threshold", 1, 8, 8), ("sdar_moe", "entropy_bounded", 4, 4, 4),
    ("sdar_moe", "sequential", 4, 1, 1), ("sdar_moe", "dynamic_pmax", 1, 4, 5),
    ("sdar", "credit", 4, 8, 8), ("sdar", "credit", 7, 4, 3),
    ("sdar", "hierarchical", 9, 8, 8), ("sdar", "hierarchical", 1, 4, 6),
]


@pytest.mark.parametrize("family,strategy,p,b,steps", SDAR_CASES)
def test_sdar_block_decoder_matches_naive(sdar_llms, family, strategy, p, b, steps):
    llm, s = sdar_llms[family], STRATEGIES[strategy]
    prompt, max_new = PROMPT_IDS[:p], 9  # >= 2 blocks of 8 for every P
    naive = naive_sdar(llm, prompt, b, steps, s, max_new, SDAR_STOP)
    assert len(naive) >= 2
    compare(llm, naive, prompt, b, steps, s, max_new, SDAR_STOP)


def test_sdar_strategies_commit_varying_counts(sdar_llms):
    """The thresholds of the adaptive strategies make real decisions on these models: some
    rounds commit one position, some several, so a wrong rule changes the tokens."""
    llm = sdar_llms["sdar"]
    for name in ("low_confidence_dynamic", "threshold", "dynamic_pmax", "entropy_bounded"):
        naive = naive_sdar(llm, PROMPT_IDS[:4], 8, 8, STRATEGIES[name], 12, SDAR_STOP)
        per_round = [blk.commits.count(r) for blk in naive for r in range(blk.rounds)]
        assert min(per_round) == 1 and max(per_round) > 1, (name, per_round)


@pytest.mark.parametrize("name,p,b,steps,max_new", [("credit", 4, 8, 8, 9),
                                                    ("hierarchical", 1, 4, 6, 8)])
def test_dinfer_strategies_make_their_own_decisions(sdar_llms, name, p, b, steps, max_new):
    """dInfer's rules commit varying counts per round on these models, and commit otherwise
    than their plain counterparts (credit without credit, the threshold rule alone)."""
    llm, s = sdar_llms["sdar"], STRATEGIES[name]
    naive = naive_sdar(llm, PROMPT_IDS[:p], b, steps, s, max_new, SDAR_STOP)
    per_round = [blk.commits.count(r) for blk in naive for r in range(blk.rounds)]
    assert min(per_round) == 1 and max(per_round) > 1, per_round
    plain = Strategy("threshold", s.threshold) if name == "hierarchical" else \
        dataclasses.replace(s, credit_weight=0.0)
    other = naive_sdar(llm, PROMPT_IDS[:p], b, steps, plain, max_new, SDAR_STOP)
    assert [blk.commits for blk in other] != [blk.commits for blk in naive]


def test_sdar_stop_token(sdar_llms):
    """A stop id ends generation after the block that holds it; output is cut before it."""
    llm, s = sdar_llms["sdar"], STRATEGIES["low_confidence_static"]
    prompt, b, steps, max_new = PROMPT_IDS[:7], 4, 4, 16
    free = naive_sdar(llm, prompt, b, steps, s, max_new, SDAR_STOP)
    seen = {t for blk in free[:2] for t in blk.tokens}
    stop_id = next(t for t in free[2].tokens if t not in seen)  # first seen in the third block
    stop = SDAR_STOP | {stop_id}
    naive = naive_sdar(llm, prompt, b, steps, s, max_new, stop)
    assert len(naive) == 3
    result = compare(llm, naive, prompt, b, steps, s, max_new, stop, stop=[stop_id])
    assert result.finish_reason == "stop" and stop_id not in result.token_ids


# (strategy, prompt length, sub-block length (None = the whole generation), steps (None = the
# sub-block length), max_new_tokens): pure diffusion, semi-AR with a short last sub-block.
CANVAS_CASES = [
    ("low_confidence_static", 5, None, None, 8), ("low_confidence_static", 3, None, 4, 10),
    ("low_confidence_static", 6, 4, None, 10), ("sequential", 9, 4, 2, 8),
    ("low_confidence_dynamic", 2, 5, 3, 12), ("entropy_bounded", 4, None, 5, 8),
    ("threshold", 7, 4, 4, 8), ("credit", 5, 4, None, 8), ("hierarchical", 3, None, None, 8),
]


@pytest.mark.parametrize("strategy,p,b,steps,max_new", CANVAS_CASES)
def test_llada_canvas_matches_naive(llada_llms, strategy, p, b, steps, max_new):
    llm, s, prompt = llada_llms["canvas"], STRATEGIES[strategy], PROMPT_IDS[:p]
    naive = naive_canvas(llm, prompt, b or max_new, steps or b or max_new, s, max_new,
                         LLADA_STOP)
    compare(llm, naive, prompt, b, steps, s, max_new, LLADA_STOP)


# (strategy, prompt length, B, T, max_new_tokens); low_confidence_dynamic with T = B is the
# reference's own rule (commit p > threshold, else the single most confident position).
DLLM_VAR_CASES = [
    ("low_confidence_dynamic", 1, 4, 4, 12), ("low_confidence_dynamic", 6, 8, 8, 16),
    ("low_confidence_static", 5, 4, 2, 12), ("threshold", 3, 4, 4, 12),
    ("entropy_bounded", 7, 4, 4, 8), ("credit", 2, 4, 4, 12), ("hierarchical", 5, 8, 8, 16),
]


@pytest.mark.parametrize("strategy,p,b,steps,max_new", DLLM_VAR_CASES)
def test_dllm_var_matches_naive(llada_llms, strategy, p, b, steps, max_new):
    llm, s, prompt = llada_llms["dllm_var"], STRATEGIES[strategy], PROMPT_IDS[:p]
    naive = naive_dllm_var(llm, prompt, b, steps, s, max_new, LLADA_STOP)
    assert len(naive) >= 2
    compare(llm, naive, prompt, b, steps, s, max_new, LLADA_STOP)
