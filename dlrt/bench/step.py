"""`dlrt bench step`: the latency of one denoising round per context length.

For each context the decoder's real round (forward of the block against the cache, LM head,
sampling, strategy, commit; the block holds seeded random ids, so MoE rows route as distinct
tokens do; a renoising family's round, DiffusionGemma's: the decoder pass of a canvas of
`canvas_length` positions with the previous round's self-conditioning signal, over a cached
prefix of the context, then `denoise_canvas_round`) is timed over many rounds with CUDA events
in four ways:
  device_loop  one graph launch whose WHILE node repeats the round R times on the GPU
  replay       the same round captured as a plain graph and replayed R times back to back
  host_loop    that graph replayed from the host with a flag read (sync) after every round
  eager        the round's tensor code called from Python
`device_loop - replay` is the WHILE node's overhead per round; `host_loop - replay` is the host
bubble of the classic design. The per-stage breakdown times variants of the replayed round:
attention (the backend call per layer) and sampling (probabilities, candidates, remasking
strategy: `denoise_round`; a renoising round's draw, acceptance and renoise:
`denoise_canvas_round`) and the routed experts of MoE layers (router, assignment, expert
kernels, combine; DiffusionGemma's: assignment, expert kernels, combine) run twice, the extra
time being their cost; the dense projections (every linear layer: QKV, o_proj, gate-up, down,
LM head) are skipped (their method swapped for one that leaves the output uninitialised), the
time saved being their cost (repeating them would read weights that fit in the 50 MB L2 from
there). `other_us` is what remains (norms, RoPE +
cache write, activations, embedding, state updates). The HBM floor is the bytes one round must
read (`floor_bytes`: weights it touches, the KV cache of the context at the cache's element
size: 1 byte with `--kv-cache-dtype fp8`; a renoising round's soft embedding and draw) over the
device-to-device copy bandwidth measured in the same run; a MoE layer counts the most experts
the block's rows can touch, min(E, k * B), each read once. The summary and the JSON record name
the KV cache dtype. On the CPU only the eager round is timed (wall clock; no graphs, no stage
breakdown) and its ratio to the floor reported (`timed: "eager"`): the path of the tests.
With `--round-kernel persistent` the round is the persistent kernel's (the stage variants then
measure nothing of it), and each context adds one stamped round's timeline (`_timeline`): its
span, the mean busy, waiting and page-wait microseconds per SM, the mean handoff of a
dependency, and by task kind the busy, waiting and page-wait microseconds and the weight GB/s.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch

from dlrt.bench.report import table, write_json
from dlrt.errors import OptionError
from dlrt.layers.linear import LinearBase
from dlrt.layers.quant import LinearMethod
from dlrt.tuning.linear import linear_layers
from dlrt.tuning.timing import event_us

COLUMNS = ["context", "device_loop_us", "replay_us", "while_overhead_us", "host_loop_us",
           "host_bubble_us", "eager_us", "floor_us", "ratio_to_floor", "GBps"]
STAGE_COLUMNS = ["context", "replay_us", "attention_us", "gemm_us", "moe_us", "sampling_us",
                 "other_us"]
BYTE_COLUMNS = ["context", "round_bytes", "weights_bytes", "lm_head_bytes", "experts_bytes",
                "kv_bytes", "renoise_bytes", "experts_touched", "experts_expected"]
PARTS = ("weights", "lm_head", "experts", "kv", "renoise")  # the floor's parts (`floor_bytes`)
# the canvas decoder's options that `--context` rows would not time (`dlrt.bench.canvas_step`)
CANVAS_OPTIONS = ("canvas_cache", "vicinity_before", "vicinity_after", "smoothing")


class SkipLinear(LinearMethod):
    """A linear method that computes nothing: it returns the output the layer's own method gave
    on its first call at this shape (made eagerly before capture), so what follows (MoE routing)
    sees the values of a real round."""

    name = "skip"

    def __init__(self, real: LinearMethod):
        self.real, self.out = real, None

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        if self.out is None or self.out.shape[:-1] != x.shape[:-1]:
            self.out = self.real.apply(layer, x).clone()
        return self.out


@contextlib.contextmanager
def repeated(owner, attr: str):
    """Within the block, `owner.attr(...)` runs twice (same inputs, the second result kept)."""
    fn = getattr(owner, attr)

    def twice(*args, **kwargs):
        fn(*args, **kwargs)
        return fn(*args, **kwargs)

    setattr(owner, attr, twice)
    try:
        yield
    finally:
        setattr(owner, attr, fn)


@contextlib.contextmanager
def _repeated_moe(model):
    """Within the block, every MoE layer's routed experts (routing, sort, expert kernels,
    combine) run twice; the shared expert and router GEMMs count as GEMMs. A layer that routes
    itself and hands its `experts` to its `method` (DiffusionGemma's) runs the method's
    `apply` (sort, expert kernels, combine) twice."""
    from dlrt.layers.moe import FusedMoE, StackedExperts

    with contextlib.ExitStack() as stack:
        for m in model.modules():
            if isinstance(m, FusedMoE):
                stack.enter_context(repeated(m, "route_and_apply"))
            elif isinstance(getattr(m, "experts", None), StackedExperts):
                stack.enter_context(repeated(m.method, "apply"))
        yield


@contextlib.contextmanager
def skipped_linears(model, keep: list):
    """Within the block, every linear layer of `model` computes nothing. The `SkipLinear`s are
    appended to `keep`: a graph captured within reads their recorded outputs, which must live
    as long as it."""
    layers = linear_layers(model)
    methods = {name: m.method for name, m in layers.items()}
    for m in layers.values():
        m.method = SkipLinear(m.method)
        keep.append(m.method)
    try:
        yield
    finally:
        for name, m in layers.items():
            m.method = methods[name]


def copy_bandwidth(device, nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written
    (default 1 GiB copied on a GPU, 64 MiB on the CPU)."""
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 1 << 26)
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / (_us(device, lambda: dst.copy_(src), reps=10) / 1e6)


def _us(device, fn, reps: int = 5) -> float:
    """Median microseconds of `fn`: CUDA events on a GPU, the wall clock elsewhere."""
    if device.type == "cuda":
        return event_us(fn, reps)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def round_bytes(llm, context: int, b: int) -> dict[str, int]:
    """`floor_bytes` of the loaded model: its parameters, the KV cache's element size (the
    model's, or 1 byte for FP8) and, under tensor parallelism, this rank's share."""
    return floor_bytes(llm.model, llm.config, context, b, llm.kv_cache.k[0].element_size(),
                       llm.engine_config.tensor_parallel_size)


def floor_bytes(model, config, context: int, b: int, kv_item: int,
                tp: int = 1) -> dict[str, int]:
    """Bytes one round of b rows reads, by part (the HBM floor's):

    weights: every parameter of `model` (its dtype's bytes, FP8 scales included) but the
        routed experts and the LM head, and b rows of the embedding table (a few parameters
        the round does not read are counted too: DiffusionGemma's encoder layer scalars, one
        value a layer);
    lm_head: the LM head's whole matrix (a tied one too: the embedding matrix, read in full
        beside the b rows of the lookup);
    experts: per MoE layer the most experts b rows can touch, min(E, k * b), each read once;
    kv: per layer K and V (both stored, also where a layer computes V = K) of the cached
        tokens the round reads: the `context` cached tokens (a sliding layer: at most the
        W - 1 before the chunk), plus the block's own b, which the round writes into the cache
        first, except in a renoising round (`canvas_length`), whose canvas K/V stay beside it;
    renoise: a renoising round's soft embedding and draw (`renoise_bytes.renoise_vocab_bytes`
        at b positions, in the embedding's dtype; 0 for other families);
    total: their sum; experts_touched: that count per MoE layer, experts_expected: the mean
    distinct count under uniform routing.

    Args:
        model: the built model (any device, meta included). config: its `ModelConfig`.
        kv_item: bytes per cached K/V element. tp: tensor-parallel size (`model` is this
            rank's share: its LM head has V / tp rows; the KV heads are counted / tp).
    """
    from dlrt.bench.renoise_bytes import renoise_vocab_bytes
    from dlrt.layers.moe import StackedExperts
    from dlrt.models.registry import family

    c = config
    embedding = family(c.family).embedding
    experts = {id(p) for m in model.modules() if isinstance(m, StackedExperts)
               for p in m.parameters()}
    head = {id(m.weight) for m in model.modules()
            if isinstance(m, LinearBase) and m.out_features == c.vocab_size // tp}
    e, k = c.num_experts, c.num_experts_per_tok
    touched = min(e, k * b) if e else 0
    parts = dict.fromkeys(PARTS, 0)
    for name, p in model.named_parameters():
        n = p.numel() * p.element_size()
        if name == embedding:
            parts["weights"] += b * c.hidden_size * p.element_size()
            if id(p) in head:  # tied: the LM head reads the whole matrix
                parts["lm_head"] += n
        elif id(p) in experts:
            parts["experts"] += n * touched // e
        elif id(p) in head:
            parts["lm_head"] += n
        else:
            parts["weights"] += n
    renoise = c.canvas_length is not None
    for layer, (heads, dim) in enumerate(c.kv_shapes()):
        window = c.layer_window(layer)
        tokens = context if window is None else min(context, window - 1)
        tokens += 0 if renoise else b
        parts["kv"] += 2 * tokens * (heads // tp) * dim * kv_item
    if renoise:
        dtype = model.get_parameter(embedding).dtype
        parts["renoise"] = renoise_vocab_bytes(c, b, dtype=dtype)["total"]
    parts["total"] = sum(parts.values())
    parts["experts_touched"] = touched
    parts["experts_expected"] = round(e * (1 - (1 - k / e) ** b), 1) if e else 0
    return parts


class _Bench:
    """The decoder's program set at a given context, plus a counter for R-round loops."""

    def __init__(self, llm, program, params, rounds: int):
        self.llm, self.p, self.params, self.rounds = llm, program, params, rounds
        self.b = self.rows(program)
        dev = llm.device
        self.counter = torch.zeros((), dtype=torch.int64, device=dev)
        self.flag = program.state.flag
        # NOTE: random ids, not mask tokens: an all-mask block routes its MoE rows alike (few
        # experts touched); distinct tokens route as a decided block's do.
        gen = torch.Generator(device=dev).manual_seed(0)
        self.init_tokens = torch.randint(0, llm.config.vocab_size, (self.b,), generator=gen,
                                         device=dev)

    @staticmethod
    def rows(program) -> int:
        """The positions a round denoises (B)."""
        return program.b

    def sampling(self):
        """The round's sampling stage, to run twice (`repeated`)."""
        from dlrt.runtime import decoder

        return repeated(decoder, "denoise_round")

    def plan(self) -> None:
        backend = self.llm.executor.backend
        if backend.plans_on_host:  # the round's forward at this context
            backend.plan_block(self.p.spans(*self.p.state.lens.tolist(), None))

    def set_context(self, context: int) -> None:
        s, b = self.p.state, self.b
        if hasattr(self.p, "canvas"):  # LLaDA: the canvas is the context
            self.p.canvas.fill_(self.llm.config.mask_token_id)
            self.p.canvas_masked.fill_(True)
            self.p.lo.fill_(0)
            s.set_lens(0, context)
        else:
            s.set_lens(context, context + b)
        s.set_request(b, 10**9, 0)
        s.set_values(self.params)
        self.plan()
        s.tokens.copy_(self.init_tokens)

    def begin(self) -> None:
        self.counter.zero_()
        self.flag.fill_(1)

    def body(self) -> None:
        self.p.round()
        s = self.p.state
        s.tokens.copy_(self.init_tokens)  # same work every round
        s.masked.fill_(True)
        if hasattr(self.p, "canvas"):
            self.p.canvas_masked.fill_(True)
        s.round.zero_()
        self.next()

    def next(self) -> None:
        self.counter.add_(1)
        self.flag.copy_((self.counter < self.rounds).int().reshape(1))

    def end(self) -> None:
        pass


class _RenoiseBench(_Bench):
    """A renoising program (`RenoiseProgram`, DiffusionGemma): every timed round is a decoder
    pass of the canvas (seeded random tokens) over `context` cached positions with the
    self-conditioning signal of the round before (soft embeddings), then
    `denoise_canvas_round` (draw, acceptance, renoise, stop test)."""

    @staticmethod
    def rows(program) -> int:
        return program.n

    def sampling(self):
        from dlrt.runtime import renoise_decoder

        return repeated(renoise_decoder, "denoise_canvas_round")

    def set_context(self, context: int) -> None:
        s = self.p.state
        s.set_values(self.params)
        s.set_lens(context, context + self.b)
        s.start_canvas(context + torch.arange(self.b, device=self.llm.device))
        self.plan()
        s.canvas.copy_(self.init_tokens)

    def body(self) -> None:
        self.p.round()
        s = self.p.state
        s.canvas.copy_(self.init_tokens)  # same work every round
        s.round.zero_()
        self.next()


def _floor(llm, context: int, b: int, bw: float, us: float) -> dict[str, Any]:
    """A row's floor columns: the round's bytes (`round_bytes`, by part), the floor at the
    copy bandwidth `bw` (bytes/s) and the ratio of `us` (the timed round) to it."""
    parts = round_bytes(llm, context, b)
    nbytes = parts.pop("total")
    floor_us = nbytes / bw * 1e6
    return dict(floor_us=floor_us, ratio_to_floor=us / floor_us, GBps=nbytes / us / 1e3,
                round_bytes=nbytes,
                **{f"{k}_bytes" if k in PARTS else k: v for k, v in parts.items()})


def _summary(llm, bench, bw: float, rounds: int) -> dict[str, Any]:
    return dict(copy_bandwidth_TBps=bw / 1e12, rounds=rounds, block_length=bench.b,
                kernels=llm.engine_config.kernels,
                kv_cache_dtype=llm.engine_config.kv_cache_dtype)


def run(llm, params, contexts: list[int], rounds: int) -> tuple[list[dict], dict[str, Any]]:
    from dlrt.runtime.graphs import WhileGraph, capture_parts
    from dlrt.runtime.renoise_decoder import RenoiseProgram

    program = _program(llm, params, max(contexts))
    kind = _RenoiseBench if isinstance(program, RenoiseProgram) else _Bench
    bench = kind(llm, program, params, rounds)
    bw = copy_bandwidth(llm.device)
    if llm.device.type != "cuda":
        return _run_eager(llm, bench, contexts, rounds, bw)
    rows = []
    eager_rounds = max(rounds // 5, 1)
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(stream):
        bench.set_context(contexts[0])
        bench.begin()
        bench.body()  # warm-up: compile, pick kernels
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        (g_round,) = capture_parts([bench.body], pool)
        wg = WhileGraph(bench.begin, bench.body, bench.end, bench.flag, pool)
        capture_s = time.perf_counter() - t0
        stages, keep = {}, []
        for stage, variant, how in (
                ("attention", repeated(llm.runner.backend, "forward"), "repeat"),
                ("gemm", skipped_linears(llm.model, keep), "skip"),
                ("sampling", bench.sampling(), "repeat"),
                ("moe", _repeated_moe(llm.model), "repeat")):
            with variant:
                bench.body()  # eager first: the skipped linears record their outputs
                stages[stage] = (capture_parts([bench.body], pool)[0], how)
        for ctx in contexts:
            bench.set_context(ctx)
            torch.cuda.synchronize()

            def replay():
                for _ in range(rounds):
                    g_round.replay()

            def host():
                for _ in range(rounds):
                    g_round.replay()
                    bench.flag.item()

            def eager():
                for _ in range(eager_rounds):
                    bench.body()

            dev_us = event_us(wg.launch) / rounds
            rep_us = event_us(replay) / rounds
            host_us = event_us(host) / rounds
            eager_us = event_us(eager, reps=2) / eager_rounds
            extra = {}
            for stage, (graph, how) in stages.items():
                us = event_us(lambda g=graph: [g.replay() for _ in range(rounds)]) / rounds
                extra[f"{stage}_us"] = us - rep_us if how == "repeat" else rep_us - us
            extra["other_us"] = rep_us - sum(extra.values())
            extra.update(_timeline(llm, bench))
            rows.append(dict(context=ctx, device_loop_us=dev_us, replay_us=rep_us,
                             while_overhead_us=dev_us - rep_us, host_loop_us=host_us,
                             host_bubble_us=host_us - rep_us, eager_us=eager_us,
                             **_floor(llm, ctx, bench.b, bw, dev_us), **extra))
        api = _launch_api_us(wg, g_round)
    torch.cuda.current_stream().wait_stream(stream)
    return rows, dict(**api, **_summary(llm, bench, bw, rounds), capture_s=capture_s,
                      body_nodes=_body_nodes(wg), timed="device_loop")


def _run_eager(llm, bench, contexts: list[int], rounds: int,
               bw: float) -> tuple[list[dict], dict[str, Any]]:
    """Off CUDA: the eager round only (wall clock, median of 2 runs of max(R / 5, 1) rounds),
    its floor and its ratio to it; the graph columns are None."""
    rows = []
    eager_rounds = max(rounds // 5, 1)
    with torch.inference_mode():
        bench.set_context(contexts[0])
        bench.begin()
        bench.body()  # warm-up
        for ctx in contexts:
            bench.set_context(ctx)

            def eager():
                for _ in range(eager_rounds):
                    bench.body()

            eager_us = _us(llm.device, eager, reps=2) / eager_rounds
            rows.append(dict(context=ctx, device_loop_us=None, replay_us=None,
                             while_overhead_us=None, host_loop_us=None, host_bubble_us=None,
                             eager_us=eager_us, **_floor(llm, ctx, bench.b, bw, eager_us)))
    return rows, dict(**_summary(llm, bench, bw, rounds), timed="eager")


def _timeline(llm, bench) -> dict[str, Any]:
    """With round_kernel='persistent': one round of the kernel with its task stamps
    (`dlrt.runtime.persistent.kernel.timeline_summary`): the round's span and the mean busy
    and waiting microseconds per SM, the mean page wait, busy / waiting / page-wait
    microseconds and weight GB/s by task kind, the mean handoff of a dependency (the third of
    three rounds); {} otherwise."""
    rounds = getattr(llm.runner.persistent, "rounds", None)
    if not rounds or bench.b not in rounds:
        return {}
    from dlrt.runtime.persistent.kernel import timeline_summary

    rnd = rounds[bench.b]
    stamped = rnd.stamped()  # built for the first context, reused for the others
    bench.p.state.tokens.copy_(bench.init_tokens)
    rnd.lens.copy_(bench.p.state.lens)
    with torch.inference_mode():
        for _ in range(3):  # the stamps of the last: caches and clocks warm
            stamped.forward(bench.p.state.tokens)
    torch.cuda.synchronize()
    t = timeline_summary(rnd.plan, stamped.timeline)
    return dict(timeline_span_us=t["span_us"], timeline_busy_us=t["mean_busy_us"],
                timeline_wait_us=t["mean_wait_us"],
                timeline_busy_by_kind_us=t["busy_by_kind_us"],
                timeline_wait_by_kind_us=t["wait_by_kind_us"],
                timeline_handoff_us=t["handoff_us"],
                timeline_handoff_by_kind_us=t["handoff_by_kind_us"],
                timeline_page_wait_us=t["mean_page_wait_us"],
                timeline_page_wait_by_kind_us=t["page_wait_by_kind_us"],
                timeline_gbps_by_kind=t["gbps_by_kind"], persistent_pages=stamped.pages)


def _launch_api_us(wg, g_round, reps: int = 20) -> dict[str, float]:
    """Host time inside the launch call (µs, median, GPU idle before it): the block graph's
    `cudaGraphLaunch` vs one round graph's replay. After each sync the GPU waits this long."""
    out = {}
    for name, fn in (("block_launch_api_us", wg.launch), ("round_replay_api_us", g_round.replay)):
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        out[name] = statistics.median(times)
    torch.cuda.synchronize()
    return out


def _body_nodes(wg) -> str:
    from dlrt.runtime.graphs import node_types

    try:
        return " ".join(f"{k}:{v}" for k, v in sorted(node_types(wg._parts[1]).items()))
    except Exception as e:  # noqa: BLE001 - a report column, not worth failing the bench
        return f"unavailable ({e})"


def _program(llm, params, max_context: int):
    dec = llm.decoder
    from dlrt.runtime.block_decoder import BlockDecoder
    from dlrt.runtime.canvas_decoder import CanvasProgram
    from dlrt.runtime.decoder import round_kind
    from dlrt.runtime.lookahead_decoder import LookaheadProgram
    from dlrt.runtime.renoise_decoder import RenoiseDecoder

    if isinstance(dec, RenoiseDecoder):  # one canvas of canvas_length positions
        return dec.program()
    kind, b = round_kind(params), params.block_length
    if isinstance(dec, BlockDecoder):
        return dec.program(params)
    if llm.decoder_name == "dllm_var":
        return LookaheadProgram(llm.runner, kind, b, llm.config.mask_token_id)
    return CanvasProgram(llm.runner, kind, b, -(-max_context // 64) * 64,
                         llm.config.mask_token_id)


def _ranks(every: list) -> dict[str, Any]:
    """The record's per-rank part under torchrun (`rows` and `summary` are rank 0's): every
    rank's rows and summary; {} in one process."""
    if len(every) == 1:
        return {}
    return dict(world=len(every), per_rank=[dict(rank=r, rows=rows, summary=summary)
                                            for r, (rows, summary) in enumerate(every)])


def resolved_engine(llm_kwargs: dict[str, Any]):
    """The engine options resolved for the checkpoint (`ResolvedConfig`; its JSON files read,
    nothing loaded; `max_model_len` left out)."""
    from dlrt.engine.config import EngineConfig
    from dlrt.engine.engine import Engine

    kw = {k: v for k, v in llm_kwargs.items() if k != "max_model_len"}
    return Engine.open(EngineConfig.from_kwargs(**kw))[0]


def block_and_limit(llm_kwargs: dict[str, Any], options: dict[str, Any]) -> tuple[int, int]:
    """(the rows of a round: a renoising model's `canvas_length`, else the block length: the
    option's, else a default request's, `ResolvedConfig.block_length`; the model's position
    limit), from the engine options resolved for the checkpoint (`resolved_engine`).

    Raises:
        OptionError: a canvas decoder's cache or smoothing option (`CANVAS_OPTIONS`), whose
            rounds are timed per prompt length only (`--prompt-lengths`).
    """
    resolved = resolved_engine(llm_kwargs)
    given = [k for k in CANVAS_OPTIONS if options.get(k) not in (None, False, 0, "none")]
    if given and resolved.engine.decoder == "canvas":
        flag = "--" + given[0].replace("_", "-")
        raise OptionError(f"{flag}: bench step times the canvas caches and smoothing per "
                          "prompt length, the canvas each prompt plus --max-new-tokens: give "
                          "--prompt-lengths (not --context)")
    return (resolved.model.canvas_length or options.get("block_length")
            or resolved.block_length, resolved.model.max_position_embeddings)


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
    from dlrt import LLM
    from dlrt.decoding.options import DecodingOptions

    contexts = [int(c) for c in args.context.split(",")]
    b, limit = block_and_limit(llm_kwargs, options)
    need = max(contexts) + 2 * b + 64
    if need > limit:
        raise OptionError(f"--context: {max(contexts)} + 2 blocks + 64 exceeds the model's "
                          f"{limit} positions; largest context: {limit - 2 * b - 64}")
    llm = LLM(**{**llm_kwargs, "max_model_len": llm_kwargs.get("max_model_len") or need})
    if llm.config.canvas_length is None:  # a renoising round's rows are the canvas's
        options = {**options, "block_length": b}
    params = llm.resolve(DecodingOptions.from_kwargs(options))
    # NOTE: under torchrun every rank times its own rounds (a cut model needs all of them)
    every = llm.collective_rpc(run, params, contexts, args.rounds)
    rows, summary = every[0]
    print(table(rows, COLUMNS))
    if "attention_us" in rows[0]:  # on CUDA: the stage breakdown
        print(table(rows, STAGE_COLUMNS))
    print(table(rows, BYTE_COLUMNS))
    if "timeline_span_us" in rows[0]:  # round_kernel='persistent': where a round's time went
        print(table(rows, ["context", "timeline_span_us", "timeline_busy_us",
                           "timeline_wait_us", "timeline_page_wait_us", "timeline_handoff_us",
                           "persistent_pages"]))
    print(table([summary], list(summary)))
    per_rank = [dict(rank=r, **row) for r, (rs, _) in enumerate(every) for row in rs]
    if len(every) > 1:  # tensor parallelism: each rank's own round times and floor (its shard)
        print(table(per_rank, ["rank", *COLUMNS]))
    for shape, rec in llm.linear_plan.records.items():
        if "reference_us" in rec:  # a quantised shape ("fp8,N,K"): every candidate
            print(f"projection [{shape}] after a norm: reference {rec['reference_us']:.1f} us "
                  f"-> {rec['chosen']}")
            for label, c in rec["candidates"].items():
                print(f"  {label}: " + (f"{c['us']:.1f} us, error {c['error']:.2g}"
                                        if c["us"] is not None else f"skipped ({c['skipped']})"))
            continue
        triton_us = rec["triton_us"]
        print(f"projection [{shape}] after a norm: cublas {rec['cublas_us']:.1f} us, triton "
              f"{triton_us if triton_us is None else round(triton_us, 1)} us -> "
              f"{rec['chosen']}")
    model = llm.engine_config.model
    name = f"step-{str(model).rstrip('/').split('/')[-1]}"
    path = write_json(name, dict(model=str(model), decoder=llm.decoder_name,
                                 dtype=str(llm.dtype), attention=llm.attention_backend,
                                 kv_cache_dtype=llm.engine_config.kv_cache_dtype,
                                 tensor_parallel_size=llm.engine_config.tensor_parallel_size,
                                 options=options, rows=rows,
                                 summary=summary, projections=llm.linear_plan.records,
                                 **_ranks(every)),
                      llm.device, args.out)
    print(f"wrote {path}")
    return 0
