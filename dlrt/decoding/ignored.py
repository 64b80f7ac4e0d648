"""Options a request sets that change nothing in it (a strategy's value under a strategy that
does not read it, a sampling filter at temperature 0, the post-step limit without token
editing, the options of renoising decoding in a family that denoises mask tokens and those of
mask decoding in a renoising family), named in one warning per request so a typo'd or
misplaced option does not pass silently."""

from __future__ import annotations

import logging

from dlrt.decoding.options import RENOISE_OPTIONS, DecodingOptions, DecodingParams
from dlrt.decoding.strategies import NEEDS_CREDIT, NEEDS_ENTROPY, USES_THRESHOLD

log = logging.getLogger(__name__)

# a sampling filter's value that turns it off: setting it asks for nothing
_OFF = {"top_k": 0, "top_p": 1.0}
# what a renoising family (DiffusionGemma) reads instead of each option of mask decoding
_MASK_ONLY = {
    "block_length": "the canvas length is the checkpoint's",
    "denoising_steps": "max_denoising_steps bounds the rounds of a canvas",
    "remasking_strategy": "entropy_bound decides what a round accepts",
    "threshold": "entropy_bound decides what a round accepts",
    "eb_threshold": "entropy_bound decides what a round accepts",
    "low_threshold": "entropy_bound decides what a round accepts",
    "credit_weight": "entropy_bound decides what a round accepts",
    "credit_boost": "entropy_bound decides what a round accepts",
    "credit_decay": "entropy_bound decides what a round accepts",
    "max_post_steps": "no token editing",
    "temperature": "the temperature runs from t_max to t_min",
    "top_k": "the denoiser samples the whole vocabulary",
    "top_p": "the denoiser samples the whole vocabulary",
}


def ignored_options(opts: DecodingOptions, params: DecodingParams) -> dict[str, str]:
    """The options `opts` sets (not None) that have no effect on the request `params` (what
    `opts` resolved to), each with why, in field order. Values the request leaves to the
    decoder or to `generation_config.json` never count, nor a filter set to its off value.
    `seed` never counts: it acts only when sampling or with `random`, and a caller that gives
    every request a seed (to repeat a run) is not mistaken on its greedy ones."""
    if params.renoise is not None:
        why = {name: f"renoising decoding does not read it: {reason}"
               for name, reason in _MASK_ONLY.items()}
        return _set(opts, why)
    strategy = params.strategy.name
    unread = f"the {strategy} strategy does not read it"
    greedy = "greedy: temperature 0 or below 1e-6"
    why = {
        "threshold": None if strategy in USES_THRESHOLD else unread,
        "eb_threshold": None if strategy in NEEDS_ENTROPY else unread,
        "low_threshold": None if strategy == "hierarchical" else unread,
        "credit_weight": None if strategy in NEEDS_CREDIT else unread,
        "credit_boost": None if strategy in NEEDS_CREDIT else unread,
        "credit_decay": None if strategy in NEEDS_CREDIT else unread,
        "max_post_steps": None if params.editing_threshold is not None else
        "no token editing (editing_threshold is not set)",
        "top_k": None if params.sampling.temperature != 0 else greedy,
        "top_p": None if params.sampling.temperature != 0 else greedy,
        **{name: "only renoising (uniform-state) families such as DiffusionGemma read it; "
           "this model denoises mask tokens" for name in RENOISE_OPTIONS},
    }
    return _set(opts, why)


def _set(opts: DecodingOptions, why: dict[str, str | None]) -> dict[str, str]:
    """Of the options named in `why` with a reason, those `opts` sets (not to an off value)."""
    out = {}
    for name, reason in why.items():
        value = getattr(opts, name)
        off = name in _OFF and value == _OFF[name]
        if reason is not None and value is not None and not off:
            out[name] = f"{name}={value!r} ({reason})"
    return out


def warn_ignored(opts: DecodingOptions, params: DecodingParams) -> None:
    """One warning line naming every option of `ignored_options` (none when there is none)."""
    ignored = ignored_options(opts, params)
    if ignored:
        log.warning("options with no effect on this request: %s", "; ".join(ignored.values()))
