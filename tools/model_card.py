#!/usr/bin/env python3
"""The numbers table of a trained model's card (its README.md), written from the folder's
training_record.json (`tools/train_default.py` writes both the weights and the record).

    python tools/model_card.py dlrt/data/sdar-stdlib-8m           # rewrite the table in place
    python tools/model_card.py dlrt/data/sdar-stdlib-8m --check   # exit 1 when it is stale

The table sits between the two marker lines below in README.md; the rest of the card names no
number of the run, so a retrained folder (the same file names) needs only this command. A row
whose field the record lacks is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BEGIN = "<!-- numbers: written from training_record.json by tools/model_card.py -->"
END = "<!-- end of numbers -->"

Record = dict[str, Any]


def field(rec: Record, key: str) -> Any:
    """The value at a dotted key ("held_out.long_block.accuracy"), None when absent."""
    value: Any = rec
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _n(v: int) -> str:
    return f"{v:,}"


def _best(rec: Record, metric: str, pick: Callable) -> str | None:
    evals = [e for e in rec.get("evaluations", []) if metric in e]
    if not evals:
        return None
    e = pick(evals, key=lambda e: e[metric])
    return f"{e[metric]:.3f} at step {_n(e['step'])}"


def _passes(rec: Record) -> str | None:
    seen, tokens = field(rec, "training.tokens_seen"), field(rec, "corpus.tokens.train")
    return f"{seen / tokens:.0f}" if seen and tokens else None


def _plain(key: str, fmt: Callable[[Any], str] = str) -> Callable[[Record], str | None]:
    return lambda rec: None if field(rec, key) is None else fmt(field(rec, key))


# (part, quantity: {block}, {long_block} and {mask_ratio} name the record's, value from the
# record, the record's field)
ROWS: list[tuple[str, str, Callable[[Record], str | None], str]] = [
    ("corpus", "tree", _plain("corpus.tree", lambda v: f"`{v}`"), "corpus.tree"),
    ("corpus", "Python", _plain("corpus.python"), "corpus.python"),
    ("corpus", "training files", _plain("corpus.files.train", _n), "corpus.files.train"),
    ("corpus", "held-out files", _plain("corpus.files.held_out", _n), "corpus.files.held_out"),
    ("corpus", "files skipped (not UTF-8)", _plain("corpus.files.skipped_not_utf8", _n),
     "corpus.files.skipped_not_utf8"),
    ("corpus", "held-out share of files", _plain("training.held_out_share"),
     "training.held_out_share"),
    ("corpus", "training tokens", _plain("corpus.tokens.train", _n), "corpus.tokens.train"),
    ("corpus", "held-out tokens", _plain("corpus.tokens.held_out", _n),
     "corpus.tokens.held_out"),
    ("tokenizer", "entries", _plain("tokenizer.vocab_size", _n), "tokenizer.vocab_size"),
    ("model", "parameters (embedding tied to the LM head)", _plain("model.parameters", _n),
     "model.parameters"),
    ("model", "hidden size", _plain("model.hidden_size"), "model.hidden_size"),
    ("model", "layers", _plain("model.num_hidden_layers"), "model.num_hidden_layers"),
    ("model", "attention heads / KV heads / head size",
     lambda r: None if field(r, "model.head_dim") is None else
     f"{field(r, 'model.num_attention_heads')} / {field(r, 'model.num_key_value_heads')} / "
     f"{field(r, 'model.head_dim')}",
     "model.num_attention_heads, num_key_value_heads, head_dim"),
    ("model", "SwiGLU width", _plain("model.intermediate_size"), "model.intermediate_size"),
    ("training", "steps", _plain("training.steps", _n), "training.steps"),
    ("training", "stopped by", _plain("training.stopped_by"), "training.stopped_by"),
    ("training", "batch", lambda r: None if field(r, "training.seq_len") is None else
     f"{field(r, 'training.batch_size')} x {field(r, 'training.seq_len')} tokens",
     "training.batch_size, seq_len"),
    ("training", "block lengths (share of steps at the second)",
     lambda r: None if field(r, "training.long_block_share") is None else
     f"{field(r, 'training.block_length')}, {field(r, 'training.long_block_length')} "
     f"({field(r, 'training.long_block_share')})",
     "training.block_length, long_block_length, long_block_share"),
    ("training", "peak learning rate", _plain("training.lr", lambda v: f"{v:g}"),
     "training.lr"),
    ("training", "final learning rate (share of peak)", _plain("training.min_lr_ratio"),
     "training.min_lr_ratio"),
    ("training", "warm-up steps", _plain("training.warmup_steps", _n), "training.warmup_steps"),
    ("training", "weight decay", _plain("training.weight_decay"), "training.weight_decay"),
    ("training", "residual dropout", lambda r: f"{field(r, 'training.dropout') or 0:g}",
     "training.dropout (absent: none)"),
    ("training", "gradient clip", _plain("training.grad_clip"), "training.grad_clip"),
    ("training", "seed", _plain("training.seed"), "training.seed"),
    ("training", "tokens seen", _plain("training.tokens_seen", _n), "training.tokens_seen"),
    ("training", "passes over the training tokens", _passes,
     "training.tokens_seen / corpus.tokens.train"),
    ("training", "time limit, minutes (--max-minutes)", _plain("training.max_minutes"),
     "training.max_minutes"),
    ("training", "minutes (training loop)", _plain("training.minutes", lambda v: f"{v:.1f}"),
     "training.minutes"),
    ("training", "device", _plain("training.device"), "training.device"),
    ("training", "torch", _plain("training.torch"), "training.torch"),
    ("held out", "windows per evaluation (steps between evaluations)",
     lambda r: None if field(r, "training.eval_windows") is None else
     f"{field(r, 'training.eval_windows')} ({field(r, 'training.eval_every')})",
     "training.eval_windows, eval_every"),
    ("held out", "masked-token accuracy, block {block} (mask ratio {mask_ratio})",
     _plain("held_out.accuracy", lambda v: f"{v:.3f}"), "held_out.accuracy"),
    ("held out", "masked-token loss, block {block}", _plain("held_out.loss", lambda v: f"{v:.3f}"),
     "held_out.loss"),
    ("held out", "masked-token accuracy, block {long_block}",
     _plain("held_out.long_block.accuracy", lambda v: f"{v:.3f}"),
     "held_out.long_block.accuracy"),
    ("held out", "masked-token loss, block {long_block}",
     _plain("held_out.long_block.loss", lambda v: f"{v:.3f}"), "held_out.long_block.loss"),
    ("held out", "unigram baseline accuracy (the most frequent token)",
     _plain("held_out.unigram_accuracy", lambda v: f"{v:.3f}"), "held_out.unigram_accuracy"),
    ("held out", "best accuracy during training, block {block}",
     lambda r: _best(r, "accuracy", max), "evaluations"),
    ("held out", "lowest loss during training, block {block}",
     lambda r: _best(r, "loss", min), "evaluations"),
    ("check", "dlrt's logits against the training model's (relative error)",
     _plain("dlrt_logits_rel_error", lambda v: f"{v:.1e}"), "dlrt_logits_rel_error"),
]


# Flags of tools/train_default.py written into the command that reproduces a run, with the
# value a record lacking the field had (dropout came after the first runs, which had none).
COMMAND_FLAGS: dict[str, Any] = {"steps": None, "batch_size": None, "lr": None,
                                 "dropout": 0.0, "seed": None, "max_minutes": None}


def command(rec: Record) -> str:
    """The `tools/train_default.py` command of the run, its main settings as flags."""
    flags = []
    for name, absent in COMMAND_FLAGS.items():
        value = field(rec, f"training.{name}")
        value = absent if value is None else value
        if value is not None:
            flags.append(f"--{name.replace('_', '-')} {value:g}")
    return ("PYTHONPATH=. python tools/train_default.py --out <folder> " + " ".join(flags))


def table(rec: Record) -> str:
    """The markdown table of `rec` and the run's command, with the markers around them."""
    names = {"block": field(rec, "training.block_length"),
             "long_block": field(rec, "held_out.long_block.block_length"),
             "mask_ratio": field(rec, "held_out.mask_ratio")}
    lines = [BEGIN, "| part | quantity | value | `training_record.json` field |",
             "| --- | --- | --- | --- |"]
    for section, what, value, key in ROWS:
        v = value(rec)
        if v is not None:
            lines.append(f"| {section} | {what.format(**names)} | {v} | `{key}` |")
    device = field(rec, "training.device") or "the recorded device"
    lines += ["", f"The run's command (on one {device}; every other setting is the record's, "
              "under `training`):", "", "```bash", command(rec), "```"]
    return "\n".join([*lines, END])


def card_with_table(card: str, rec: Record) -> str:
    """`card` with the text between the markers replaced by `table(rec)`.

    Raises:
        ValueError: the card lacks the markers.
    """
    start, end = card.find(BEGIN), card.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the card has no table markers ({BEGIN!r} ... {END!r})")
    return card[:start] + table(rec) + card[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="model folder with README.md and "
                   "training_record.json")
    p.add_argument("--check", action="store_true", help="exit 1 when the table is stale")
    args = p.parse_args(argv)
    card_path = args.folder / "README.md"
    rec = json.loads((args.folder / "training_record.json").read_text())
    card = card_path.read_text()
    new = card_with_table(card, rec)
    if args.check:
        if new != card:
            print(f"{card_path}: the table differs from training_record.json; run "
                  f"python tools/model_card.py {args.folder}", file=sys.stderr)
            return 1
        return 0
    if new != card:
        card_path.write_text(new)
        print(f"{card_path}: table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
