"""Options of renoising (uniform-state) decoding, DiffusionGemma's: their resolved values
(`RenoiseParams`), the defaults (a checkpoint's `generation_config.json`, else transformers'
`DiffusionGemmaGenerationConfig._get_default_generation_params`) and their validation (the
reference's rules, plus the bounds a device round needs)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlrt.decoding.renoise import schedule_temperature
from dlrt.decoding.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE
from dlrt.errors import OptionError

# NOTE: every round is a forward and the server checks cancellation and its timeout only
# between canvases (as MAX_POST_STEPS).
MAX_DENOISING_STEPS = 1024
FILE = "generation_config.json"


@dataclass(frozen=True)
class RenoiseParams:
    """Resolved values of renoising decoding, named as in transformers'
    `DiffusionGemmaGenerationConfig` (`entropy_bound` is its `sampler_config.entropy_bound`);
    the defaults are the reference's.

    max_denoising_steps: rounds per canvas at most, in [1, MAX_DENOISING_STEPS] (1024).
    entropy_bound: nats, > 0; a round accepts the lowest-entropy positions while the sum of
        their entropies minus the largest stays <= it (`renoise.accept_by_entropy`).
    t_min, t_max: 0 <= t_min < t_max <= 1e6; the temperature falls linearly from t_max at
        round 0 to t_min + (t_max - t_min) / max_denoising_steps at the last round, which must
        be >= 1e-6 (`renoise.schedule_temperature`).
    stability_threshold: rounds, in [0, 2^63); a canvas stops early at a round whose argmax
        canvas equals those of the `stability_threshold` rounds before it (0: any round) and
        whose mean entropy is below confidence_threshold (`renoise.should_stop`).
    confidence_threshold: nats, > 0 (inf: stability alone decides).
    """

    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005


NAMES = tuple(f.name for f in dataclasses.fields(RenoiseParams))
_INTS = ("max_denoising_steps", "stability_threshold")
_TEMPERATURE = (lambda v: 0.0 <= v <= MAX_TEMPERATURE,
                f"must be in [0, {MAX_TEMPERATURE:g}] (a temperature: the logits are divided by "
                "it in fp32)")
# name -> (test of a value, what a good value is)
_RANGES: dict[str, tuple[Any, str]] = {
    "max_denoising_steps": (lambda v: 1 <= v <= MAX_DENOISING_STEPS,
                            f"must be in [1, {MAX_DENOISING_STEPS}] (rounds per canvas, each a "
                            "forward)"),
    "entropy_bound": (lambda v: v > 0.0, "must be a number > 0 (nats)"),
    "t_min": _TEMPERATURE,
    "t_max": _TEMPERATURE,
    "stability_threshold": (lambda v: 0 <= v < 2**63, "must be in [0, 2^63) (rounds)"),
    "confidence_threshold": (lambda v: v > 0.0, "must be a number > 0 (nats)"),
}


def checkpoint_defaults(generation_config: dict[str, Any]) -> dict[str, Any]:
    """The values of `NAMES` that `generation_config.json` sets, as written there
    (`entropy_bound` from its `sampler_config` object, as transformers saves it).

    Raises:
        OptionError: `sampler_config` is not an object.
    """
    out = {k: generation_config[k] for k in NAMES if generation_config.get(k) is not None
           and k != "entropy_bound"}
    sampler = generation_config.get("sampler_config")
    if sampler is not None and not isinstance(sampler, dict):
        raise OptionError(f"{FILE}: sampler_config={sampler!r} must be an object "
                          "({\"entropy_bound\": ...})")
    if sampler is not None and sampler.get("entropy_bound") is not None:
        out["entropy_bound"] = sampler["entropy_bound"]
    return out


def resolve_renoise(given: dict[str, Any], generation_config: dict[str, Any],
                    joint: bool = True) -> RenoiseParams:
    """The values of a request: `given` (name -> value or None, types already checked by
    `DecodingOptions`), else `generation_config.json`'s, else the reference's; each checked
    against its range, and with `joint` the schedule as a whole (t_max > t_min, the last
    round's temperature >= 1e-6).

    Raises:
        OptionError: a value out of range; the message starts with the option's name, or with
            "generation_config.json:" for a checkpoint default (wrong type or out of range).
    """
    file = checkpoint_defaults(generation_config)
    values, from_file = {}, set()
    for name in NAMES:
        kind = int if name in _INTS else float
        if given.get(name) is not None:
            values[name] = kind(given[name])
        elif name in file:
            values[name] = kind(_file_value(name, file[name], kind))
            from_file.add(name)
        else:
            values[name] = getattr(RenoiseParams, name)
    for name, (ok, why) in _RANGES.items():
        _check(ok(values[name]), name, values[name], why, name in from_file)
    params = RenoiseParams(**values)
    if joint:
        _check_schedule(params, given, from_file)
    return params


def _check_schedule(p: RenoiseParams, given: dict[str, Any], from_file: set[str]) -> None:
    """t_max > t_min (the reference's rule), and a last-round temperature of at least 1e-6.
    The error names the option the request set (t_min when it set t_min and not t_max, else
    t_max), and says it comes from generation_config.json when the request set none."""
    temps = {"t_min", "t_max"}
    req = {k for k in (*temps, "max_denoising_steps") if given.get(k) is not None}
    name = "t_min" if "t_min" in req and "t_max" not in req else "t_max"
    other = f"t_max={p.t_max!r}" if name == "t_min" else f"t_min={p.t_min!r}"
    _check(p.t_max > p.t_min, name, getattr(p, name),
           f"must be {'<' if name == 't_min' else '>'} {other} (the schedule falls from t_max "
           "to t_min)", not req & temps and bool(from_file & temps))
    steps = p.max_denoising_steps
    last = schedule_temperature(p.t_min, p.t_max, steps, steps - 1).item()
    name = "max_denoising_steps" if req == {"max_denoising_steps"} else name
    _check(last >= MIN_TEMPERATURE, name, getattr(p, name),
           f"makes the last round's temperature t_min + (t_max - t_min) / max_denoising_steps "
           f"= {last:.3g} (t_min={p.t_min!r}, t_max={p.t_max!r}, max_denoising_steps={steps}), "
           f"below {MIN_TEMPERATURE:g}",
           not req and bool(from_file & (temps | {"max_denoising_steps"})))


def _file_value(name: str, raw: Any, kind: type) -> Any:
    number = not isinstance(raw, bool) and isinstance(raw, int if kind is int else (int, float))
    if number and kind is float:
        try:
            float(raw)
        except OverflowError:
            number = False
    if not number:
        raise OptionError(f"{FILE}: {name}={raw!r} must be "
                          f"{'an integer' if kind is int else 'a number'} (the checkpoint's "
                          "default, used when a request does not set it)")
    return raw


def _check(ok: bool, name: str, value: Any, why: str, from_file: bool) -> None:
    if ok:
        return
    if from_file:
        raise OptionError(f"{FILE}: {name}={value!r} {why} (the checkpoint's default, used "
                          "when a request does not set it)")
    raise OptionError(f"{name}={value!r} {why}")

