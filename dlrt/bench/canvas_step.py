"""`dlrt bench step --prompt-lengths`: the rounds of a LLaDA canvas request, one row per round.

For each prompt length P the request is P prompt tokens and `max_new_tokens` G to generate
(the canvas: T = P + G positions) in sub-blocks of `block_length` B, and its rows time the
rounds of its first sub-block (positions P..P+B), with the request's remasking strategy:

  exact    `canvas_cache` "none": the whole canvas forwarded, the LM head on the B rows (the
           baseline of every row at this P; with `smoothing` a second exact row, its LM head
           on the whole canvas and the soft embedding w * softmax(logits) @ E after it)
  refresh  a cache's round 0: the whole canvas forwarded, its K/V written into the cache
  window   a cache's later rounds: "prefix" the sub-block and everything after it (P..T)
           against the cached K/V before it; "dual" the sub-block alone against the cached
           K/V before and after it, with `vicinity_before` / `vicinity_after` that many
           positions around it too

Every row has its own HBM floor (`canvas_floor_bytes`) and its ratio to it, and `speedup`:
the exact row's time at the same P over its own. The floor counts the positions a round must
forward (`CanvasRound.tokens`: the canvas's T, a window's positions within it); the programs
forward whole buffers (T rounded up to whole sub-blocks and to a multiple of 64; a prefix
window as long as the generation's sub-blocks), whose extra positions count against the
ratio. Each row builds the program a request of that P runs (the decoder's sizes,
`canvas_slots`: one captured round serves every sub-block, so each sub-block's window
forwards as many positions as the first's) and fills the canvas with seeded random ids, the
generation's positions marked masked, so MoE rows route as distinct tokens do (the floor
counts the experts distinct rows can touch); each timed round starts from that canvas again.
Timing as `dlrt.bench.step`'s: the device loop (one graph whose WHILE node repeats the round R
times) and the eager round on CUDA, the eager round only elsewhere (`timed: "eager"`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from dlrt.bench.report import table, write_json
from dlrt.bench.step import _us, copy_bandwidth, floor_bytes, resolved_engine
from dlrt.errors import OptionError

COLUMNS = ["prompt", "cache", "vicinity", "smoothing", "round", "tokens", "keys", "lm_rows",
           "device_loop_us", "eager_us", "floor_us", "ratio_to_floor", "speedup", "GBps"]
BYTE_COLUMNS = ["prompt", "cache", "vicinity", "smoothing", "round", "round_bytes",
                "weights_bytes", "lm_head_bytes", "experts_bytes", "kv_read_bytes",
                "kv_write_bytes", "logits_bytes", "soft_bytes", "experts_touched"]
PARTS = ("weights", "lm_head", "experts", "kv_read", "kv_write", "logits", "soft")


@dataclass(frozen=True)
class CanvasRound:
    """One timed round of a request's first sub-block.

    prompt: P; canvas: T = P + G; cache: "none" | "prefix" | "dual"; round: "exact" |
    "refresh" | "window"; start: the first position forwarded; tokens: positions forwarded
    (the chunk, whose K/V the round writes); keys: keys attended (positions 0..T);
    lm_rows: rows of the LM head; block: the sub-block's positions (the commit's rows);
    vicinity_before / vicinity_after: the request's (a dual window's positions before the
    sub-block, clipped to the prompt, and after it; 0 without a dual cache);
    smoothing: the LM head on the whole canvas and the soft embedding after it.
    """

    prompt: int
    canvas: int
    cache: str
    round: str
    start: int
    tokens: int
    keys: int
    lm_rows: int
    block: int
    vicinity_before: int = 0
    vicinity_after: int = 0
    smoothing: bool = False

    @property
    def cached(self) -> int:
        """Keys the round reads from the cache (attended, outside its chunk)."""
        return self.keys - self.tokens


def canvas_slots(prompt: int, gen: int, b: int, cache: str, before: int = 0,
                 after: int = 0) -> tuple[int, int, int]:
    """(span, buffer, window) of a request as the canvas decoder sizes it
    (`CanvasDecoder._size` / `_buffer`): the canvas's slots (whole sub-blocks, padded to a
    multiple of 64), the buffer's (a cache's windows reach past the canvas), the window's
    length (0: no cache). `before` is the vicinity already clipped to the prompt."""
    from dlrt.runtime.canvas_cache import cached_sizes
    from dlrt.runtime.canvas_program import PAD_TO

    blocks = -(-gen // b)
    span = -(-(prompt + blocks * b) // PAD_TO) * PAD_TO
    if cache == "none":
        return span, span, 0
    return (span, *cached_sizes(cache, b, span, blocks, before, after))


def canvas_rounds(prompt: int, params) -> list[CanvasRound]:
    """The rows of one prompt length for a request's `DecodingParams`: the exact round, with
    smoothing the smoothed exact round, with a cache its refresh and window rounds (smoothed
    with smoothing: their LM head on every row they forward past the vicinity before)."""
    total, b = prompt + params.max_new_tokens, params.block_length
    block = min(b, params.max_new_tokens)
    out = [CanvasRound(prompt, total, "none", "exact", 0, total, total, block, block)]
    if params.smoothing is not None:
        out.append(CanvasRound(prompt, total, "none", "exact", 0, total, total, total, block,
                               smoothing=True))
    cache = params.canvas_cache
    if cache == "none":
        return out
    before, after = min(params.vicinity_before, prompt), params.vicinity_after
    smooth = params.smoothing is not None
    out.append(CanvasRound(prompt, total, cache, "refresh", 0, total, total,
                           total if smooth else block, block, before, after, smooth))
    start = prompt - before
    tokens = total - start if cache == "prefix" else min(before + block + after, total - start)
    out.append(CanvasRound(prompt, total, cache, "window", start, tokens, total,
                           tokens - before if smooth else block, block, before, after, smooth))
    return out


def canvas_floor_bytes(model, config, rnd: CanvasRound, kv_item: int,
                       dtype: torch.dtype = torch.bfloat16, tp: int = 1) -> dict[str, int]:
    """Bytes one canvas round must move, by part (its HBM floor's):

    weights, lm_head, experts: as `dlrt.bench.step.floor_bytes` for the round's chunk of
        `rnd.tokens` rows (every parameter read once, the chunk's embedding rows; per MoE
        layer the min(E, k * tokens) experts the chunk can touch);
    kv_read: K and V of the `rnd.cached` keys the round reads from the cache;
    kv_write: K and V of the chunk, written (attention reads them back: counted once);
    logits: the LM head's [lm_rows, V] written and the sub-block's [block, V] read by the
        commit, in `dtype`;
    soft: with smoothing, the soft embedding's [lm_rows, V] logits read, the [V, d]
        embedding read and [lm_rows, d] written (`ops.soft_embedding`), in `dtype`;
    total: their sum; experts_touched: that count per MoE layer.

    Args:
        model: the built model (any device, meta included). config: its `ModelConfig`.
        kv_item: bytes per cached K/V element. dtype: the model's (logits, soft embeddings).
        tp: tensor-parallel size (`model` is this rank's share: V / tp logits, KV heads / tp).
    """
    parts = floor_bytes(model, config, 0, rnd.tokens, kv_item, tp)
    out = {k: parts[k] for k in ("weights", "lm_head", "experts")}
    per_key = sum(2 * (heads // tp) * dim * kv_item for heads, dim in config.kv_shapes())
    out["kv_read"] = rnd.cached * per_key
    out["kv_write"] = rnd.tokens * per_key
    item = torch.empty((), dtype=dtype).element_size()
    v, d = config.vocab_size // tp, config.hidden_size
    out["logits"] = (rnd.lm_rows + rnd.block) * v * item
    out["soft"] = (rnd.lm_rows * v + v * d + rnd.lm_rows * d) * item if rnd.smoothing else 0
    out["total"] = sum(out[k] for k in PARTS)
    out["experts_touched"] = parts["experts_touched"]
    return out


class _CanvasBench:
    """The program of one prompt length and cache (as a request of it builds it) and its
    rounds, each timed round starting from the same canvas; a counter for R-round loops."""

    def __init__(self, llm, params, rnd: CanvasRound, rounds: int):
        from dlrt.runtime.canvas_cache import CachedCanvasProgram
        from dlrt.runtime.canvas_program import CanvasProgram
        from dlrt.runtime.decoder import round_kind

        self.llm, self.rnd, self.rounds = llm, rnd, rounds
        b, p, mask = params.block_length, rnd.prompt, llm.config.mask_token_id
        before = min(params.vicinity_before, p) if rnd.cache == "dual" else 0
        span, size, window = canvas_slots(p, params.max_new_tokens, b, rnd.cache, before,
                                          params.vicinity_after)
        kind = round_kind(params)
        if rnd.cache == "none":
            self.p = CanvasProgram(llm.runner, kind, b, span, mask, rnd.smoothing)
        else:
            self.p = CachedCanvasProgram(llm.runner, kind, b, size, span, window, rnd.cache,
                                         mask, before, rnd.smoothing)
        dev, s = llm.device, self.p.state
        gen = torch.Generator(device=dev).manual_seed(0)
        self.canvas = torch.randint(0, llm.config.vocab_size, (size,), generator=gen,
                                    device=dev)
        self.canvas[rnd.canvas:] = mask  # padding: never attended
        self.masked = torch.zeros(size, dtype=torch.bool, device=dev)
        self.masked[p:rnd.canvas] = True
        s.set_values(params)
        if rnd.smoothing:
            self.p.smoothing.set_request(params.strategy.threshold, params.smoothing)
        s.set_lens(0 if rnd.cache == "none" else p - before, rnd.canvas)
        s.set_request(rnd.block, params.denoising_steps, params.sampling.seed)
        self.counter = torch.zeros((), dtype=torch.int64, device=dev)
        self.flag = s.flag
        self.step = self.p.refresh if rnd.round == "refresh" else self.p.round
        self.p.lo.fill_(p)
        self.reset()
        if rnd.round == "window":  # the cache the window reads: a refresh's K/V
            self.p.refresh()
        else:
            self.p.begin()
        self.reset()

    @contextlib.contextmanager
    def planned(self):
        """Within the block, a backend that plans on the host has the plan of this round's
        forwards (as the executor plans a block)."""
        backend = self.llm.executor.backend
        if not backend.plans_on_host:
            yield
            return
        phase = "refresh" if self.rnd.round == "refresh" else None
        backend.plan_block(self.p.spans(*self.p.state.lens.tolist(), phase))
        try:
            yield
        finally:
            backend.end_block()

    def reset(self) -> None:
        """The canvas and the sub-block as they were before the round (device only)."""
        self.p.canvas.copy_(self.canvas)
        self.p.canvas_masked.copy_(self.masked)
        s = self.p.state
        s.masked.copy_(self.p.canvas_masked.index_select(0, self.p.rows()))
        s.round.zero_()
        if self.rnd.smoothing:
            self.p.smoothing.rounds_run.zero_()

    def begin(self) -> None:
        self.counter.zero_()
        self.flag.fill_(1)

    def body(self) -> None:
        self.step()
        self.reset()
        self.counter.add_(1)
        self.flag.copy_((self.counter < self.rounds).int().reshape(1))

    def end(self) -> None:
        self.counter.add_(0)  # NOTE: not an empty capture (an empty graph releases its pool)


def _time(llm, bench: _CanvasBench, rounds: int, pool) -> dict[str, float | None]:
    """{device_loop_us, eager_us} of one round: the device loop's and the eager round's on
    CUDA (events), the eager round's only elsewhere (wall clock; device_loop_us None)."""
    with bench.planned():
        return _timed(llm, bench, rounds, pool)


def _timed(llm, bench: _CanvasBench, rounds: int, pool) -> dict[str, float | None]:
    eager_rounds = max(rounds // 5, 1)

    def eager():
        for _ in range(eager_rounds):
            bench.body()

    bench.begin()
    bench.body()  # warm-up: compile, pick kernels
    if llm.device.type != "cuda":
        return dict(device_loop_us=None, eager_us=_us(llm.device, eager, reps=2) / eager_rounds)
    from dlrt.runtime.graphs import WhileGraph
    from dlrt.tuning.timing import event_us

    torch.cuda.synchronize()
    wg = WhileGraph(bench.begin, bench.body, bench.end, bench.flag, pool)
    try:
        dev_us = event_us(wg.launch) / rounds
    finally:
        torch.cuda.synchronize()
        wg.close()
    return dict(device_loop_us=dev_us, eager_us=event_us(eager, reps=2) / eager_rounds)


def run(llm, params, prompts: list[int], rounds: int) -> tuple[list[dict], dict[str, Any]]:
    """Every row (`canvas_rounds`) of every prompt length, timed, with its floor, its ratio to
    it and its speedup over the exact row of its prompt length; and the run's summary."""
    bw = copy_bandwidth(llm.device)
    timed = "device_loop" if llm.device.type == "cuda" else "eager"
    kv_item = llm.kv_cache.k[0].element_size()
    tp = llm.engine_config.tensor_parallel_size
    cuda = llm.device.type == "cuda"
    stream = torch.cuda.Stream() if cuda else None
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with torch.inference_mode(), (torch.cuda.stream(stream) if stream
                                  else contextlib.nullcontext()):
        for prompt in prompts:
            baseline = None
            for rnd in canvas_rounds(prompt, params):
                # NOTE: a pool per row: a pool whose graphs were all released cannot be reused
                pool = torch.cuda.graph_pool_handle() if cuda else None
                us = _time(llm, _CanvasBench(llm, params, rnd, rounds), rounds, pool)
                parts = canvas_floor_bytes(llm.model, llm.config, rnd, kv_item, llm.dtype, tp)
                nbytes, t = parts.pop("total"), us[f"{timed}_us"]
                baseline = t if baseline is None else baseline  # the exact row comes first
                floor_us = nbytes / bw * 1e6
                rows.append(dict(
                    **asdict(rnd), vicinity=f"{rnd.vicinity_before}/{rnd.vicinity_after}",
                    **us, floor_us=floor_us, ratio_to_floor=t / floor_us, speedup=baseline / t,
                    GBps=nbytes / t / 1e3, round_bytes=nbytes,
                    **{f"{k}_bytes" if k in PARTS else k: v for k, v in parts.items()}))
    if stream is not None:
        torch.cuda.current_stream().wait_stream(stream)
    summary = dict(copy_bandwidth_TBps=bw / 1e12, rounds=rounds, timed=timed,
                   block_length=params.block_length, max_new_tokens=params.max_new_tokens,
                   canvas_cache=params.canvas_cache, vicinity_before=params.vicinity_before,
                   vicinity_after=params.vicinity_after, smoothing=params.smoothing is not None,
                   remasking_strategy=params.strategy.name, kernels=llm.engine_config.kernels,
                   kv_cache_dtype=llm.engine_config.kv_cache_dtype,
                   seconds=time.perf_counter() - t0)
    return rows, summary


def check_request(llm_kwargs: dict[str, Any], options: dict[str, Any],
                  prompts: list[int]) -> int:
    """The positions the largest prompt's programs need (the LLM's `max_model_len`), after
    checking, before any weight loads, that the model's decoder is the canvas decoder and
    that the largest buffer fits.

    Raises:
        OptionError: naming --prompt-lengths (another decoder; too long for the model).
    """
    from dlrt.decoding.options import DEFAULT_MAX_NEW_TOKENS

    resolved = resolved_engine(llm_kwargs)
    decoder = resolved.engine.decoder
    if decoder != "canvas":
        raise OptionError(f"--prompt-lengths: times the 'canvas' decoder's rounds (LLaDA); "
                          f"this model's decoder is {decoder!r}: give --context")
    gen = options.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS
    b = options.get("block_length") or resolved.decoder_defaults.block_length or gen
    cache = options.get("canvas_cache") or "none"
    after = options.get("vicinity_after") or 0
    need = max(canvas_slots(p, gen, b, cache, min(options.get("vicinity_before") or 0, p),
                            after)[1] for p in prompts)
    limit = resolved.model.max_position_embeddings
    if need > limit:
        raise OptionError(f"--prompt-lengths: a prompt of {max(prompts)} and "
                          f"{gen} new tokens need {need} positions, beyond the model's "
                          f"{limit}")
    return need


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
    from dlrt import LLM
    from dlrt.decoding.options import DecodingOptions

    prompts = list(args.prompt_lengths)
    need = check_request(llm_kwargs, options, prompts)
    llm = LLM(**{**llm_kwargs, "max_model_len": llm_kwargs.get("max_model_len") or need})
    params = llm.resolve(DecodingOptions.from_kwargs(options))
    every = llm.collective_rpc(run, params, prompts, args.rounds)
    rows, summary = every[0]
    print(table(rows, COLUMNS))
    print(table(rows, BYTE_COLUMNS))
    print(table([summary], list(summary)))
    model = llm.engine_config.model
    name = f"step-{str(model).rstrip('/').split('/')[-1]}"
    path = write_json(name, dict(model=str(model), decoder=llm.decoder_name,
                                 dtype=str(llm.dtype), attention=llm.attention_backend,
                                 kv_cache_dtype=llm.engine_config.kv_cache_dtype,
                                 tensor_parallel_size=llm.engine_config.tensor_parallel_size,
                                 options=options, prompt_lengths=prompts, rows=rows,
                                 summary=summary, projections=llm.linear_plan.records),
                      llm.device, args.out)
    print(f"wrote {path}")
    return 0
