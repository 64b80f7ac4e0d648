"""Options a request sets that change nothing in it (a strategy's value under a strategy that
does not read it, a sampling filter at temperature 0, the post-step limit without token
editing), named in one warning per request so a typo'd or misplaced option does not pass
silently."""

from __future__ import annotations

import logging

from dlrt.decoding.options import DecodingOptions, DecodingParams
from dlrt.decoding.strategies import NEEDS_CREDIT, NEEDS_ENTROPY, USES_THRESHOLD

log = logging.getLogger(__name__)

# a sampling filter's value that turns it off: setting it asks for nothing
_OFF = {"top_k": 0, "top_p": 1.0}


def ignored_options(opts: DecodingOptions, params: DecodingParams) -> dict[str, str]:
    """The options `opts` sets (not None) that have no effect on the request `params` (what
    `opts` resolved to), each with why, in field order. Values the request leaves to the
    decoder or to `generation_config.json` never count, nor a filter set to its off value.
    `seed` never counts: it acts only when sampling or with `random`, and a caller that gives
    every request a seed (to repeat a run) is not mistaken on its greedy ones."""
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
    }
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
