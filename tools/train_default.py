#!/usr/bin/env python3
"""Train the default model: a small SDAR model on this Python's standard library source.

    PYTHONPATH=. python tools/train_default.py --out /tmp/dlrt-default

Corpus split by file (5% held out), byte-level BPE tokenizer (8192 entries), SDAR's
block-diffusion objective at block lengths 4 and 8, AdamW with a cosine schedule, bf16
autocast on CUDA. Writes a Hugging Face folder that `dlrt.LLM(folder)` loads. Every flag is a
field of `dlrt.train.loop.TrainConfig`; the defaults train for about 3 minutes on one H200.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dlrt.errors import DlrtError
from dlrt.train.loop import TrainConfig, flag, train


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(TrainConfig):
        name = flag(f.name)
        if f.type in ("bool", bool):
            p.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default,
                           help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            p.add_argument(name, type=kind, default=f.default, help=f.metadata["help"])
    return p


def main(argv: list[str] | None = None) -> int:
    """Train and print a summary. A user error (a setting that cannot run, an existing output
    folder, a missing corpus, a checkpoint dlrt refuses) prints one `error: ...` line and exits
    with status 2; anything else keeps its traceback."""
    args = parser().parse_args(argv)
    try:
        result = train(TrainConfig(**vars(args)))
    except (ValueError, FileExistsError, FileNotFoundError, DlrtError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    rec = result.record
    summary = {"folder": str(result.folder), "parameters": rec["model"]["parameters"],
               "steps": rec["training"]["steps"], "minutes": round(rec["training"]["minutes"], 2),
               "stopped_by": rec["training"]["stopped_by"], "held_out": rec["held_out"],
               "dlrt_logits_rel_error": rec.get("dlrt_logits_rel_error")}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
