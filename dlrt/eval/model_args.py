"""The harness's model arguments (`--model_args name=value,...`) of the `dlrt` model: every
engine option and every decoding option under its command-line name, the estimator's settings,
and what the harness itself passes (`batch_size`, `max_batch_size`, `device`).

Engine options are `EngineConfig`'s fields, named as the CLI's engine flags (`load_seed` is the
seed of dummy weights, `--load-seed`); `pretrained` (the harness's name) or `model` is the
checkpoint. Decoding options are `DecodingOptions`' fields (`max_new_tokens`, `block_length`,
`remasking_strategy`, `threshold`, `temperature`, `seed`, `stop`, ...): the defaults of every
generate_until request. `seed` also seeds the log-likelihood draws (default 0). `mc_num` (draws
per estimate, default 128) and `check_greedy` (compute is_greedy, default true) set the
estimator (`dlrt.eval.likelihood`). Names, types, choices and ranges are checked as the CLI and
`LLM(...)` check them, before a model is loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlrt.decoding.options import DecodingOptions, check_ranges
from dlrt.engine.config import ENGINE_FLAGS, EngineConfig
from dlrt.errors import OptionError
from dlrt.eval.likelihood import MC_NUM

# the harness's own arguments: accepted, without effect (dlrt runs one sequence per forward)
HARNESS = ("batch_size", "max_batch_size")
ESTIMATOR = {"mc_num": MC_NUM, "check_greedy": True}


def engine_names() -> dict[str, str]:
    """model argument -> `EngineConfig` field (the CLI's flag names, dashes as underscores)."""
    out = {"pretrained": "model"}
    for f in dataclasses.fields(EngineConfig):
        flag = ENGINE_FLAGS.get(f.name)
        out[flag[2:].replace("-", "_") if flag else f.name] = f.name
    return out


def known_names() -> list[str]:
    """Every model argument the `dlrt` model takes."""
    decoding = [f.name for f in dataclasses.fields(DecodingOptions)]
    return sorted({*engine_names(), *decoding, *ESTIMATOR, *HARNESS})


@dataclass(frozen=True)
class ModelArgs:
    """Model arguments sorted by their owner.

    engine: `LLM(**engine)` keywords (`model` included). decoding: `DecodingOptions` keywords,
    the defaults of every generate_until request. mc_num, seed, check_greedy: the estimator's.
    harness: the harness's own arguments (batch_size, max_batch_size), kept for the record.
    """

    engine: dict[str, Any]
    decoding: dict[str, Any]
    mc_num: int
    seed: int
    check_greedy: bool
    harness: dict[str, Any]


def parse_model_args(args: dict[str, Any]) -> ModelArgs:
    """Sort and check `args` (the harness's parsed `--model_args` plus its `batch_size`,
    `max_batch_size` and `device`; values already typed: ints, floats, booleans, strings).

    Raises:
        OptionError: an unknown name (the message lists the known ones), `pretrained` and
            `model` both given, or a value of the wrong type, out of range or not among an
            option's choices (the message names the option).
    """
    known = set(known_names())
    unknown = sorted(set(args) - known)
    if unknown:
        raise OptionError(f"unknown model argument(s) {unknown} of the dlrt model; known: "
                          f"{sorted(known)}")
    if "pretrained" in args and "model" in args:
        raise OptionError("give the checkpoint once: pretrained or model, not both")
    names = engine_names()
    decoding_fields = {f.name for f in dataclasses.fields(DecodingOptions)}
    engine = {names[k]: v for k, v in args.items() if k in names}
    decoding = {k: v for k, v in args.items() if k in decoding_fields}
    EngineConfig.from_kwargs(**engine)
    check_ranges(DecodingOptions.from_kwargs(decoding))
    mc_num = args.get("mc_num", ESTIMATOR["mc_num"])
    if isinstance(mc_num, bool) or not isinstance(mc_num, int) or mc_num < 1:
        raise OptionError(f"mc_num must be an integer >= 1, got {mc_num!r}")
    check_greedy = args.get("check_greedy", ESTIMATOR["check_greedy"])
    if not isinstance(check_greedy, bool):
        raise OptionError(f"check_greedy must be true or false, got {check_greedy!r}")
    seed = decoding.get("seed")
    return ModelArgs(engine=engine, decoding=decoding, mc_num=mc_num,
                     seed=0 if seed is None else seed, check_greedy=check_greedy,
                     harness={k: args[k] for k in HARNESS if k in args})
