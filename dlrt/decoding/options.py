"""Decoding options: what a request may set (`DecodingOptions`, None = default) and the one step
that resolves them against the decoder's defaults and `generation_config.json`
(`DecodingParams`, every field concrete and validated)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from dlrt.decoding.logprobs import MAX_TOP_LOGPROBS
from dlrt.decoding.renoise_options import NAMES as RENOISE_OPTIONS
from dlrt.decoding.renoise_options import RenoiseParams, resolve_renoise
from dlrt.decoding.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingSpec
from dlrt.decoding.strategies import (
    CREDIT_BOOST,
    CREDIT_DECAY,
    CREDIT_WEIGHT,
    LOW_THRESHOLD,
    MAX_CREDIT_WEIGHT,
    STRATEGIES,
    StrategySpec,
)
from dlrt.errors import OptionError

# max_new_tokens of a request that sets none (the canvas decoder's default block is as long)
DEFAULT_MAX_NEW_TOKENS = 128
# NOTE: every post pass is a forward; a block that keeps editing runs them all, and the server
# checks cancellation and its timeout only between blocks.
MAX_POST_STEPS = 1024
FP32_MAX = 3.4028234663852886e38  # the largest finite fp32 value (credit_boost is fp32 there)
# approximate KV caches of the canvas decoder (Fast-dLLM): none (exact), prefix, dual
CANVAS_CACHES = ("none", "prefix", "dual")
MAX_VICINITY = 1 << 20  # positions recomputed on each side of a sub-block, at most


@dataclass(frozen=True)
class DecodingOptions:
    """Per-request options of `LLM.generate`. None means: the decoder's / checkpoint's default.

    max_new_tokens: tokens to generate at most (>= 1).
    block_length: B, positions denoised together (>= 1).
    denoising_steps: T, round budget per block (>= 1); default B (one token per round).
    remasking_strategy: one of `dlrt.decoding.strategies.STRATEGIES`.
    threshold: confidence bar in [0, 1] (low_confidence_dynamic, threshold, dynamic_pmax,
        credit, hierarchical).
    eb_threshold: entropy budget in nats (> 0) of `entropy_bounded`.
    low_threshold: in [0, 1]; `hierarchical` commits a span's most confident position only
        when its p is above it (dInfer's low_threshold; default 0.4).
    credit_weight: in [0, 100]; `credit` adds credit_weight * log(1 + credit) to the logits
        (dInfer's credit_alpha; default 0.7).
    credit_boost: in [0, FP32_MAX] (fp32 on the device); each round adds p ** credit_boost to
        the credit of a masked position's argmax token (dInfer's boost_gamma; default 0.2).
    credit_decay: in [0, 1]; the share of the credit kept from one round to the next
        (dInfer's decay_beta; default 0.8).
    editing_threshold: in [0, 1]; rewrite a decided position of the active block when its
        candidate differs with p above it (LLaDA2.1 token editing; `block` decoder and
        families that edit only). Default None: no edits.
    max_post_steps: 0..MAX_POST_STEPS (1024), passes over a block with no mask left while
        edits continue (editing only; default 16).
    temperature: in [0, MAX_TEMPERATURE] = [0, 1e6] (the logits are divided by it in fp32);
        0, and anything below MIN_TEMPERATURE (1e-6, SGLang's bar), is greedy.
    top_k: >= 0 (0 = off). top_p: in (0, 1].
    max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
        confidence_threshold: renoising (uniform-state) decoding, DiffusionGemma's; see
        `dlrt.decoding.renoise_options.RenoiseParams` (ranges, defaults). Families that
        denoise mask tokens do not read them.
    canvas_cache: the `canvas` decoder's approximate KV cache (Fast-dLLM), one of
        CANVAS_CACHES: "none" (default; every round re-runs the whole canvas, exact),
        "prefix" (each sub-block's first round re-runs the canvas and caches its K/V; later
        rounds forward the sub-block and everything after it against the cached prefix),
        "dual" (later rounds forward the sub-block alone against the cached prefix and
        suffix). Faster, not exact.
    vicinity_before, vicinity_after: >= 0 (default 0); with canvas_cache "dual", the later
        rounds also recompute that many positions before / after the sub-block (dInfer's
        vicinity refresh, prefix_look / after_look): their fresh K/V replace the cached ones;
        logits and commits stay the sub-block's. `vicinity_before` is clipped to the prompt
        length (the window never starts before position 0 and keeps one length per request),
        positions past the canvas are never attended. Non-zero needs canvas_cache "dual".
    smoothing: dInfer's iteration smoothing (`IterationSmooth`, over a canvas cache its
        `IterSmoothWithVicinityCache`; the `canvas` decoder with any canvas_cache, and the
        `block` decoder without editing; remasking_strategy one of SMOOTHING_STRATEGIES): a
        masked position enters a forward as its mask embedding plus
        w * softmax(logits) @ E of the last forward that saw it, w = min(cont_weight_init
        + cont_weight_growth * i, cont_weight), and a forward commits with the bar
        max(1 - threshold_decay * i, threshold), i the request's forwards run before it
        (across blocks). Default False.
    cont_weight, cont_weight_init, cont_weight_growth: finite numbers >= 0 (defaults 0.3,
        0.15, 0.02); threshold_decay: in [0, 1] (default 0.02). Setting one needs smoothing.
    seed: >= 0; sampling, `random` and renoising are reproducible for a given seed.
    stop: extra stop token ids (int) or stop strings (str).
    ignore_eos: do not stop at the checkpoint's stop ids (benchmarks).
    logprobs: return each generated token's log-probability under the distribution its round
        drew it from (`dlrt.decoding.logprobs`; rounds of their own kind, which compute it on
        the device). Default False.
    top_logprobs: 0..MAX_TOP_LOGPROBS (20), the most likely tokens of that distribution
        returned beside each token (default 0); needs logprobs.
    """

    max_new_tokens: int | None = None
    block_length: int | None = None
    denoising_steps: int | None = None
    remasking_strategy: str | None = None
    threshold: float | None = None
    eb_threshold: float | None = None
    low_threshold: float | None = None
    credit_weight: float | None = None
    credit_boost: float | None = None
    credit_decay: float | None = None
    editing_threshold: float | None = None
    max_post_steps: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    max_denoising_steps: int | None = None
    entropy_bound: float | None = None
    t_min: float | None = None
    t_max: float | None = None
    stability_threshold: int | None = None
    confidence_threshold: float | None = None
    canvas_cache: str | None = None
    vicinity_before: int | None = None
    vicinity_after: int | None = None
    smoothing: bool = False
    cont_weight: float | None = None
    cont_weight_init: float | None = None
    cont_weight_growth: float | None = None
    threshold_decay: float | None = None
    seed: int | None = None
    stop: tuple[int | str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int | None = None

    @staticmethod
    def from_kwargs(kwargs: dict[str, Any]) -> DecodingOptions:
        """Build from keyword options. Raises OptionError on an unknown name or a bad type."""
        names = {f.name for f in dataclasses.fields(DecodingOptions)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise OptionError(f"unknown decoding option(s) {unknown}; known: {sorted(names)}")
        kw = {k: v for k, v in kwargs.items() if v is not None}
        if "stop" in kw:
            stop = kw["stop"]
            stop = [stop] if isinstance(stop, (str, int)) else stop
            if not isinstance(stop, (list, tuple)):
                raise OptionError("stop must be a token id, a string, or a list of them")
            kw["stop"] = tuple(stop)
        opts = DecodingOptions(**kw)
        opts._check_types()
        return opts

    def _check_types(self) -> None:
        ints = ("max_new_tokens", "block_length", "denoising_steps", "top_k", "seed",
                "max_post_steps", "max_denoising_steps", "stability_threshold",
                "vicinity_before", "vicinity_after", "top_logprobs")
        floats = ("threshold", "eb_threshold", "low_threshold", "credit_weight", "credit_boost",
                  "credit_decay", "editing_threshold", "temperature", "top_p", "entropy_bound",
                  "t_min", "t_max", "confidence_threshold", *SMOOTHING)
        for name in ints:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise OptionError(f"{name} must be an integer, got {v!r}")
        for name in floats:
            v = getattr(self, name)
            if v is not None and not _is_number(v):
                raise OptionError(f"{name} must be a number, got {v!r}")
        for name in ("remasking_strategy", "canvas_cache"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise OptionError(f"{name} must be a string, got {v!r}")
        for s in self.stop:
            if isinstance(s, bool) or not isinstance(s, (int, str)) or s == "":
                raise OptionError(f"stop entries must be token ids or non-empty strings, got {s!r}")
        for name in ("ignore_eos", "smoothing", "logprobs"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"{name} must be true or false, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class DecoderDefaults:
    """A decoder's (or a family's) defaults; `block_length=None` means one block over the
    whole generation; `editing_threshold=None`: no edits. `renoise`: the family's canvases
    hold no mask token but uniform tokens, renoised where a round rejects them (uniform-state
    diffusion, DiffusionGemma); `resolve` then fills `DecodingParams.renoise`."""

    block_length: int | None
    remasking_strategy: str
    threshold: float = 0.9
    eb_threshold: float = 0.35
    low_threshold: float = LOW_THRESHOLD
    credit_weight: float = CREDIT_WEIGHT
    credit_boost: float = CREDIT_BOOST
    credit_decay: float = CREDIT_DECAY
    editing_threshold: float | None = None
    max_post_steps: int = 16
    renoise: bool = False


# dInfer's `IterationSmooth` defaults, by option name
SMOOTHING = {"cont_weight": 0.3, "cont_weight_init": 0.15, "cont_weight_growth": 0.02,
             "threshold_decay": 0.02}
# the strategies smoothing commits with: dInfer's decoders that take its per-round bar
# (`ThresholdParallelDecoder`, `CreditThresholdParallelDecoder`, `HierarchyDecoder`)
SMOOTHING_STRATEGIES = ("threshold", "credit", "hierarchical")


@dataclass(frozen=True)
class Smoothing:
    """Iteration smoothing's values (see `DecodingOptions.smoothing`)."""

    cont_weight: float
    cont_weight_init: float
    cont_weight_growth: float
    threshold_decay: float


@dataclass(frozen=True)
class DecodingParams:
    """Resolved, validated options of one request (`editing_threshold` None: no edits;
    `renoise` None: the family denoises mask tokens, see `DecoderDefaults.renoise`;
    `logprobs`: record them, with `top_logprobs` alternatives per token)."""

    max_new_tokens: int
    block_length: int
    denoising_steps: int
    strategy: StrategySpec
    sampling: SamplingSpec
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...] = field(default=())
    editing_threshold: float | None = None
    max_post_steps: int = 16
    renoise: RenoiseParams | None = None
    canvas_cache: str = "none"
    vicinity_before: int = 0
    vicinity_after: int = 0
    smoothing: Smoothing | None = None
    logprobs: bool = False
    top_logprobs: int = 0


def resolve(opts: DecodingOptions, defaults: DecoderDefaults, generation_config: dict[str, Any],
            eos_token_ids: tuple[int, ...], default_max_new_tokens: int,
            random_seed: int) -> DecodingParams:
    """Fill every None from the decoder defaults and `generation_config.json`, then validate.

    Sampling defaults follow `generation_config.json` when it sets `do_sample` (as vLLM does);
    otherwise greedy. `random_seed` is used when the request gives no seed. The renoising
    options are checked for every family (their ranges) and resolved, against
    `generation_config.json` and the schedule as a whole, when `defaults.renoise`
    (`renoise_options.resolve_renoise`).

    Raises:
        OptionError: a value out of range (the message names the option): threshold,
            low_threshold, credit_decay or editing_threshold outside [0, 1], credit_weight
            outside [0, 100], credit_boost outside fp32's [0, 3.4e38], a temperature outside
            [0, 1e6], a negative max_post_steps, t_max <= t_min, a non-zero
            vicinity_before / vicinity_after without canvas_cache "dual", top_logprobs
            outside [0, 20] or without logprobs, ...; a sampling
            default of `generation_config.json` out of range (the message starts with
            "generation_config.json:"; `CheckpointFolder.check_generation_config` refuses
            such a file when the model loads).
    """
    gen = generation_config
    sample = bool(gen.get("do_sample", False))
    max_new = _pick(opts.max_new_tokens, default_max_new_tokens)
    _check(max_new >= 1, "max_new_tokens", max_new, "must be >= 1")
    block = _pick(opts.block_length, defaults.block_length, max_new)
    _check(block >= 1, "block_length", block, "must be >= 1")
    steps = _pick(opts.denoising_steps, block)
    _check(steps >= 1, "denoising_steps", steps, "must be >= 1")
    _check(steps < 2**63, "denoising_steps", steps, "must be < 2^63")
    name = _pick(opts.remasking_strategy, defaults.remasking_strategy)
    _check(name in STRATEGIES, "remasking_strategy", name, f"must be one of {STRATEGIES}")
    threshold = float(_pick(opts.threshold, defaults.threshold))
    _check(0.0 <= threshold <= 1.0, "threshold", threshold, "must be in [0, 1]")
    eb = float(_pick(opts.eb_threshold, defaults.eb_threshold))
    _check(math.isfinite(eb) and eb > 0.0, "eb_threshold", eb, "must be a finite number > 0")
    low = float(_pick(opts.low_threshold, defaults.low_threshold))
    _check(0.0 <= low <= 1.0, "low_threshold", low, "must be in [0, 1]")
    weight = float(_pick(opts.credit_weight, defaults.credit_weight))
    _check(0.0 <= weight <= MAX_CREDIT_WEIGHT, "credit_weight", weight,
           f"must be in [0, {MAX_CREDIT_WEIGHT:g}]")
    boost = float(_pick(opts.credit_boost, defaults.credit_boost))
    _check(0.0 <= boost <= FP32_MAX, "credit_boost", boost,
           f"must be a number in [0, {FP32_MAX:.4g}] (fp32 on the device)")
    decay = float(_pick(opts.credit_decay, defaults.credit_decay))
    _check(0.0 <= decay <= 1.0, "credit_decay", decay, "must be in [0, 1]")
    editing = _pick(opts.editing_threshold, defaults.editing_threshold)
    editing = None if editing is None else float(editing)
    _check(editing is None or 0.0 <= editing <= 1.0, "editing_threshold", editing,
           "must be in [0, 1]")
    post = _pick(opts.max_post_steps, defaults.max_post_steps)
    _check(0 <= post <= MAX_POST_STEPS, "max_post_steps", post,
           f"must be in [0, {MAX_POST_STEPS}] (post passes a block may run while edits go on)")
    file = {k: gen.get(k) for k in SAMPLING} if sample else {}
    temperature = _sampling(opts.temperature, file, "temperature")
    temperature = 0.0 if temperature < MIN_TEMPERATURE else temperature  # greedy
    top_k = _sampling(opts.top_k, file, "top_k")
    top_p = _sampling(opts.top_p, file, "top_p")
    cache = _pick(opts.canvas_cache, "none")
    _check(cache in CANVAS_CACHES, "canvas_cache", cache, f"must be one of {CANVAS_CACHES}")
    vicinity = {}
    for side in ("vicinity_before", "vicinity_after"):
        v = vicinity[side] = _pick(getattr(opts, side), 0)
        _check(0 <= v <= MAX_VICINITY, side, v, f"must be in [0, {MAX_VICINITY}]")
        _check(v == 0 or cache == "dual", side, v,
               f"works only with canvas_cache='dual', not {cache!r}")
    smoothing = _smoothing(opts)
    seed = _pick(opts.seed, random_seed)
    _check(0 <= seed < 2**63, "seed", seed, "must be in [0, 2^63)")
    top_logprobs = _pick(opts.top_logprobs, 0)
    _check(0 <= top_logprobs <= MAX_TOP_LOGPROBS, "top_logprobs", top_logprobs,
           f"must be in [0, {MAX_TOP_LOGPROBS}]")
    _check(opts.top_logprobs is None or opts.logprobs, "top_logprobs", top_logprobs,
           "needs logprobs=True")
    renoise = resolve_renoise({k: getattr(opts, k) for k in RENOISE_OPTIONS},
                              gen if defaults.renoise else {}, joint=defaults.renoise)
    stop_ids = {s for s in opts.stop if isinstance(s, int)}
    if not opts.ignore_eos:
        stop_ids |= set(eos_token_ids)
    return DecodingParams(
        max_new_tokens=max_new,
        block_length=block,
        denoising_steps=steps,
        strategy=StrategySpec(name, threshold, eb, low, weight, boost, decay),
        sampling=SamplingSpec(temperature, top_k, top_p, seed),
        stop_token_ids=frozenset(stop_ids),
        stop_strings=tuple(s for s in opts.stop if isinstance(s, str)),
        editing_threshold=editing,
        max_post_steps=post,
        renoise=renoise if defaults.renoise else None,
        canvas_cache=cache,
        **vicinity,
        smoothing=smoothing,
        logprobs=opts.logprobs,
        top_logprobs=top_logprobs,
    )


def _smoothing(opts: DecodingOptions) -> Smoothing | None:
    """The request's iteration smoothing (None: off), its values checked.

    Raises:
        OptionError: a smoothing value out of range, or one set without smoothing (names
            the option).
    """
    values = {}
    for name, default in SMOOTHING.items():
        given = getattr(opts, name)
        _check(given is None or opts.smoothing, name, given, "works only with smoothing=True")
        v = values[name] = float(_pick(given, default))
        top = 1.0 if name == "threshold_decay" else FP32_MAX
        _check(0.0 <= v <= top, name, v, f"must be a number in [0, {top:.4g}]")
    return Smoothing(**values) if opts.smoothing else None


def check_smoothing(params: DecodingParams, decoder: str) -> None:
    """Iteration smoothing is the `canvas` decoder's (with or without a canvas cache) and the
    `block` decoder's without editing, with a strategy of SMOOTHING_STRATEGIES.

    Raises:
        OptionError: smoothing with another decoder, strategy, or with editing_threshold
            (names the option).
    """
    if params.smoothing is None:
        return
    _check(decoder in ("canvas", "block"), "smoothing", True,
           f"works only with the 'canvas' and 'block' decoders, not {decoder!r}; leave it "
           "unset")
    name = params.strategy.name
    _check(name in SMOOTHING_STRATEGIES, "smoothing", True,
           f"works only with remasking_strategy in {SMOOTHING_STRATEGIES}, not {name!r}")
    _check(params.editing_threshold is None, "smoothing", True,
           "works only without token editing (editing_threshold); leave one of them unset")


def check_editing(params: DecodingParams, family: str, supports_editing: bool,
                  decoder: str) -> None:
    """Editing needs a family trained to edit (LLaDA2) and the `block` decoder.

    Raises:
        OptionError: editing asked of another family or decoder (names editing_threshold).
    """
    value = params.editing_threshold
    if value is None:
        return
    _check(supports_editing, "editing_threshold", value,
           f"asks for token editing, which the {family} family was not trained for (only "
           "LLaDA2 models edit decided tokens); leave it unset")
    _check(decoder == "block", "editing_threshold", value,
           f"works only with the 'block' decoder, not {decoder!r} (any remasking strategy)")


def check_canvas_cache(params: DecodingParams, decoder: str) -> None:
    """An approximate KV cache (`canvas_cache` other than "none") is the `canvas` decoder's:
    the other decoders cache exactly already, or denoise no mask token. As in Fast-dLLM, one
    sub-block over the whole generation is allowed (the cache then holds the prompt).

    Raises:
        OptionError: canvas_cache "prefix" or "dual" with another decoder (names the option).
    """
    value = params.canvas_cache
    _check(value == "none" or decoder == "canvas", "canvas_cache", value,
           f"works only with the 'canvas' decoder (LLaDA), not {decoder!r}; leave it unset")


def check_ranges(opts: DecodingOptions) -> None:
    """The checks of `resolve` that need no model (ranges of the values given), so a front end
    can refuse a bad value before it loads one.

    Raises:
        OptionError: a value out of range (the message starts with the option's name).
    """
    resolve(opts, DecoderDefaults(None, "sequential"), {}, (), 1, 0)


def option_name(error: Exception) -> str | None:
    """The decoding option an `OptionError` is about (its message starts with the name)."""
    head = str(error).split("=", 1)[0].split(" ", 1)[0]
    return head if head in {f.name for f in dataclasses.fields(DecodingOptions)} else None


def as_flag_error(error: OptionError) -> OptionError:
    """The error with the command-line flag of its option in front ("--max-new-tokens: ...")."""
    name = option_name(error)
    return OptionError(f"--{name.replace('_', '-')}: {error}" if name else str(error))


def _is_number(v: Any) -> bool:
    """An int (not a bool) or float that converts to a float (huge ints overflow)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        float(v)
    except OverflowError:
        return False
    return True


# the sampling options that generation_config.json may default (with do_sample):
# name -> (type, test of a value, what a good value is, the value that turns it off)
SAMPLING: dict[str, tuple[type, Any, str, Any]] = {
    "temperature": (float, lambda v: 0.0 <= v <= MAX_TEMPERATURE,
                    f"must be in [0, {MAX_TEMPERATURE:g}] (the logits are divided by it in fp32; "
                    f"below {MIN_TEMPERATURE:g} it is greedy)", 0.0),
    "top_k": (int, lambda v: v >= 0, "must be >= 0 (0 = off)", 0),
    "top_p": (float, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]", 1.0),
}


def sampling_default_problem(name: str, raw: Any, in_range: bool = True) -> str | None:
    """Why `raw`, a `generation_config.json` value of the sampling option `name` (a key of
    `SAMPLING`), cannot be used ("must be ..."), or None when it can: it must be an integer
    (top_k) or a number, and with `in_range` also pass the option's range."""
    kind, ok, why, _ = SAMPLING[name]
    if isinstance(raw, bool) or not isinstance(raw, int if kind is int else (int, float)):
        return f"must be {'an integer' if kind is int else 'a number'}"
    if not in_range:
        return None
    if kind is float and not _is_number(raw):
        return "must be a number"
    return None if ok(kind(raw)) else why


def _sampling(given: Any, file: dict[str, Any], name: str) -> Any:
    """A sampling option: the request's value, else `generation_config.json`'s (`file`: its
    values when it sets do_sample), else the value that turns it off; checked against
    `SAMPLING`. A bad value from the file says it comes from there (the request did not set
    it).

    Raises:
        OptionError: "temperature=-1.0 must be ...", or "generation_config.json: temperature=-3
            must be ... (the checkpoint's default, used when a request does not set it)".
    """
    kind, ok, why, off = SAMPLING[name]
    if given is not None:
        value = kind(given)
        _check(ok(value), name, value, why)
        return value
    raw = file.get(name)
    if raw is None:
        return off
    problem = sampling_default_problem(name, raw)
    if problem is None:
        return kind(raw)
    raise OptionError(f"generation_config.json: {name}={raw!r} {problem} (the checkpoint's "
                      "default, used when a request does not set it)")


def _pick(*values):
    """The first value that is not None (None when the last is)."""
    return next((v for v in values if v is not None), None)


def _check(ok: bool, name: str, value: Any, why: str) -> None:
    if not ok:
        raise OptionError(f"{name}={value!r} {why}")
