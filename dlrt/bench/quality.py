"""Decoding quality against speed, per remasking strategy and block length (`dlrt bench quality`).

For every block length and strategy setting (`SETTINGS`: the strategies with their threshold
values; greedy, temperature 0) on one loaded model:

- held-out continuation: from held-out Python files (by default the held-out split of the
  standard-library corpus the default model is trained on, `dlrt.train.corpus`), each file is
  tokenized whole and cut at the first token that starts at or after a line start (a token
  that straddles the line start, such as byte-level BPE's newline-plus-indent, stays in the
  prefix), so prefix and truth are the ids the model sees in the file; a sample is the last
  `prefix_tokens` tokens before the cut and the next `new_tokens` tokens. The model continues
  the prefix greedily for `new_tokens` tokens (EOS ignored). `token_accuracy`: the share of
  generated tokens equal to the file's token at the same position; `first_line_exact`: the
  share of samples whose generated text and the file agree up to the truth's first newline
  (the rest of the cut line, exactly).
- HumanEval: each prompt's end is first cut back to a token boundary of its natural
  tokenization (`prompt_cut`: a prompt ends in a newline, which a byte-level BPE merges with
  the indentation of the body's first line into one token, so the model is asked to write that
  token itself, as it saw it in training). The model completes it (up to `humaneval_tokens`
  tokens, stopping at EOS or at the first stop sequence of the Codex evaluation, `STOPS`: a new
  top-level def / class / if / print / comment), and `parses` is the share of completions that
  write something before the first stop and that `ast.parse` accepts together with their
  prompt; `empty` is the share that write nothing (the prompt alone parses: its docstring is a
  body). With no HumanEval prompts (`--num-prompts 0`) both are None (not measured; "-" in
  the table).
- speed: `tpf` (new tokens per denoising round, both sets together), `rounds_per_block`, and
  `tps` (new tokens per second of generate calls, in the LLM's execution mode). Each row
  first runs one untimed request of two blocks with its options, so that graph capture and
  compilation for a new block length or strategy are not timed. With data parallelism
  (`--data-parallel-size`) the held-out samples and HumanEval prompts of a row are shared
  among the groups as `LLM.generate` shares a list (longest first, by prompt tokens + new
  tokens), each group warming up and timing its own share: `group_tps` is each group's new
  tokens over its seconds, `tps` all new tokens over the longest group's seconds.

The LLaDA canvas decoder's request options (`REQUEST_OPTIONS`: `--canvas-cache`,
`--vicinity-before`, `--vicinity-after`, `--smoothing` and its values) go to every request of
every setting; a setting that cannot take them (smoothing needs the threshold strategy) is
refused before the model loads. The record names them, and `--resume` takes a record of the
same options only.

Before the first setting it times one held-out and one HumanEval request of it and prints
about how long the run takes; after each setting, the time left. The JSON record is rewritten
after each setting (a partial record, `"complete": false`, until the last); Ctrl-C keeps what
finished, says so in one line and exits with status 130, and `--resume RECORD` runs the
settings the record lacks. At the end it prints a table and, when matplotlib is installed,
writes a PNG beside the record (`quality_plot`): TPF against held-out token accuracy, a colour
per setting, a marker per block length.

    dlrt bench quality --blocks 4 --settings sequential,low_confidence_dynamic@0.9,threshold@0.9 \
        --num-heldout 8 --num-prompts 8        # minutes on 2 CPU cores
    dlrt bench quality --blocks 4,8            # every setting: about an hour on 2 CPU cores
"""

from __future__ import annotations

import ast
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from dlrt.bench.report import table, write_json
from dlrt.errors import OptionError

# (label, decoding options): the strategies and the settings the table compares
SETTINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("sequential", {"remasking_strategy": "sequential"}),
    ("low_confidence_static", {"remasking_strategy": "low_confidence_static"}),
    *((f"low_confidence_dynamic@{t}",
       {"remasking_strategy": "low_confidence_dynamic", "threshold": t})
      for t in (0.7, 0.8, 0.9, 0.95)),
    *((f"threshold@{t}", {"remasking_strategy": "threshold", "threshold": t})
      for t in (0.7, 0.9)),
    ("entropy_bounded", {"remasking_strategy": "entropy_bounded"}),
    ("dynamic_pmax", {"remasking_strategy": "dynamic_pmax"}),
    ("random", {"remasking_strategy": "random"}),
    ("credit", {"remasking_strategy": "credit"}),
    ("hierarchical", {"remasking_strategy": "hierarchical"}),
)
# request options the command line gives every setting (the LLaDA canvas decoder's cache and
# iteration smoothing: `dlrt.decoding.options.DecodingOptions`)
REQUEST_OPTIONS = ("canvas_cache", "vicinity_before", "vicinity_after", "smoothing",
                   "cont_weight", "cont_weight_init", "cont_weight_growth", "threshold_decay")
STOPS = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")
COLUMNS = ["block", "setting", "token_accuracy", "first_line_exact", "parses", "empty", "tpf",
           "rounds_per_block", "tps"]  # + group_tps with data parallelism


def with_options(chosen: list[tuple[str, dict[str, Any]]],
                 options: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each setting's options plus `options` (`REQUEST_OPTIONS` given on the command line),
    the ranges and combinations of each checked before any model loads.

    Raises:
        OptionError: "--settings LABEL: --FLAG: ..." naming the setting and the option it
            cannot take (smoothing with a strategy outside SMOOTHING_STRATEGIES, a value out of
            range).
    """
    from dlrt.decoding.options import (
        SMOOTHING_STRATEGIES,
        DecodingOptions,
        as_flag_error,
        check_ranges,
    )

    out = []
    for label, setting in chosen:
        merged = {**setting, **options}
        try:
            check_ranges(DecodingOptions.from_kwargs(merged))
            strategy = merged.get("remasking_strategy")
            if merged.get("smoothing") and strategy not in SMOOTHING_STRATEGIES:
                raise OptionError(f"smoothing=True works only with remasking_strategy in "
                                  f"{SMOOTHING_STRATEGIES}, not {strategy!r}")
        except OptionError as e:
            raise OptionError(f"--settings {label}: {as_flag_error(e)}") from None
        out.append((label, merged))
    return out


def settings(names: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The settings named (comma-separated labels or strategy names; None: all).

    Raises:
        ValueError: a name that is neither a label nor a strategy of `SETTINGS`.
    """
    if not names:
        return list(SETTINGS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    out = []
    for name in wanted:
        hits = [s for s in SETTINGS if name in (s[0], s[1]["remasking_strategy"])]
        if not hits:
            raise ValueError(f"unknown setting {name!r}; one of "
                             f"{', '.join(label for label, _ in SETTINGS)}")
        out += [s for s in hits if s not in out]
    return out


def _token_starts(tokenizer, text: str) -> tuple[list[int], list[int] | None]:
    """The ids of all of `text` (no special tokens) and each token's start offset in it; None
    for the offsets when the tokenizer gives none (not a fast tokenizer)."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, TypeError, ValueError, KeyError):
        return list(tokenizer.encode(text, add_special_tokens=False)), None
    return list(enc["input_ids"]), [start for start, _ in offsets]


def heldout_samples(tokenizer, texts: list[str], count: int, prefix_tokens: int,
                    new_tokens: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Up to `count` (prefix ids, true continuation ids) pairs: files taken in a seeded order,
    one sample each (cycling while more are needed and some file can give one).

    Each file is tokenized once, whole. The cut is a line start at a seeded position in the
    middle half of the file's lines, moved to token k, the first token that starts at or after
    it (a token that straddles the line start, such as a newline-plus-indent token of a
    byte-level BPE, stays in the prefix); the prefix is ids[max(0, k - prefix_tokens):k] and
    the truth ids[k:k + new_tokens], so both are the ids of the whole-file tokenization. A cut
    with k < 8 or fewer than `new_tokens` tokens after it gives no sample. Without offsets (a
    tokenizer that is not fast) k is the token count of the text before the line start.
    """
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    encoded: dict[int, tuple[list[int], list[int] | None]] = {}
    out: list[tuple[list[int], list[int]]] = []
    while len(out) < count:
        before = len(out)
        for i in order:
            lines = texts[i].splitlines(keepends=True)
            if len(lines) < 8:
                continue
            cut = rng.randrange(len(lines) // 4, 3 * len(lines) // 4)
            at = sum(len(line) for line in lines[:cut])  # the line start, in characters
            if i not in encoded:
                encoded[i] = _token_starts(tokenizer, texts[i])
            ids, starts = encoded[i]
            if starts is None:
                k = len(tokenizer.encode(texts[i][:at], add_special_tokens=False))
            else:
                k = next((j for j, start in enumerate(starts) if start >= at), len(ids))
            if k < 8 or len(ids) - k < new_tokens:
                continue
            out.append((ids[max(0, k - prefix_tokens):k], ids[k:k + new_tokens]))
            if len(out) == count:
                break
        if len(out) == before:  # no file can give a sample
            break
    return out


def first_line_match(generated: str, truth: str) -> bool:
    """Whether `generated` equals `truth` up to and including truth's first newline (all of
    truth when it has none)."""
    end = truth.find("\n")
    line = truth if end < 0 else truth[:end + 1]
    return generated[:len(line)] == line


def until_stop(completion: str) -> str:
    """`completion` up to the first of `STOPS` (all of it when none occurs)."""
    cut = min((i for i in (completion.find(s) for s in STOPS) if i >= 0),
              default=len(completion))
    return completion[:cut]


def parses(prompt: str, completion: str) -> bool:
    """Whether prompt + completion, cut at the first of `STOPS`, is valid Python."""
    try:
        ast.parse(prompt + until_stop(completion))
    except (SyntaxError, ValueError):
        return False
    return True


def prompt_cut(tokenizer, prompt: str, follow: str = "    pass\n") -> str:
    """`prompt` without the tail that its natural tokenization merges with the text after it.

    Tokenizes prompt + `follow` (a function body's first line) whole; when a token starts
    inside the prompt and ends past it (byte-level BPE's newline-plus-indent token), the
    prompt is cut at that token's start, so the model writes the whole token. Unchanged when
    the prompt ends on a token boundary, or when the tokenizer gives no offsets.
    """
    text = prompt + follow
    try:
        offsets = tokenizer(text, add_special_tokens=False,
                            return_offsets_mapping=True)["offset_mapping"]
    except (NotImplementedError, TypeError, ValueError, KeyError):
        return prompt
    end = len(prompt)
    start = next((a for a, b in offsets if a < end < b), end)
    return prompt[:start]


def trained_on_python(folder: Path) -> str | None:
    """The Python version whose standard library the model in `folder` was trained on (its
    `training_record.json`'s corpus.python, as `dlrt.train` writes it); None when the folder
    has no such record."""
    from dlrt.train.export import RECORD_NAME

    try:
        python = json.loads((folder / RECORD_NAME).read_text())["corpus"]["python"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return python if isinstance(python, str) else None


def python_mismatch(heldout_python: str, trained_on: str | None) -> str | None:
    """A one-line warning when the held-out files (the running Python's standard library)
    come from another Python major.minor than the model's training corpus; else None."""
    def minor(version: str) -> str:
        return ".".join(version.split(".")[:2])

    if trained_on is None or minor(heldout_python) == minor(trained_on):
        return None
    return (f"warning: the held-out files come from Python {minor(heldout_python)}'s library "
            f"while the model was trained on Python {minor(trained_on)}'s, so the numbers "
            "are not comparable to the model card's")


def _generate(llm, prompt, options: dict[str, Any], stats: dict[str, float]):
    if llm.device.type == "cuda":
        import torch

        torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = llm.generate(prompt, **options)
    stats["seconds"] += time.perf_counter() - t0
    stats["tokens"] += len(r.token_ids)
    stats["rounds"] += sum(r.denoise_steps)
    stats["blocks"] += len(r.denoise_steps)
    return r


def score(llm, block: int, options: dict[str, Any], samples, prompts: list[str],
          new_tokens: int, humaneval_tokens: int) -> dict[str, Any]:
    """One row of the table: quality on both sets and the speed of the generate calls (with
    data parallelism, each group running its share: `tally`)."""
    groups = getattr(llm, "data_parallel_size", 1)
    args = (block, options, samples, prompts, new_tokens, humaneval_tokens)
    if groups == 1:
        parts = [tally(llm, *args)]
    else:
        every = llm.collective_rpc(tally, *args)
        parts = every[::len(every) // groups]  # each group's first rank
    sums = {k: sum(p[k] for p in parts) for k in parts[0]}
    seconds = max(p["seconds"] for p in parts)
    row = dict(
        token_accuracy=sums["correct"] / max(len(samples) * new_tokens, 1),
        first_line_exact=sums["lines"] / max(len(samples), 1),
        parses=sums["ok"] / len(prompts) if prompts else None,
        empty=sums["empty"] / len(prompts) if prompts else None,
        tpf=sums["tokens"] / max(sums["rounds"], 1),
        rounds_per_block=sums["rounds"] / max(sums["blocks"], 1),
        tps=sums["tokens"] / max(seconds, 1e-9),
        heldout_samples=len(samples), humaneval_prompts=len(prompts),
        new_tokens=sums["tokens"], rounds=sums["rounds"])
    if groups > 1:
        row["group_tps"] = [round(p["tokens"] / max(p["seconds"], 1e-9), 3) for p in parts]
    return row


def tally(llm, block: int, options: dict[str, Any], samples, prompts: list[str],
          new_tokens: int, humaneval_tokens: int) -> dict[str, Any]:
    """`score`'s counts over this rank's data-parallel group's share of `samples` and
    `prompts` (every one without data parallelism; on every rank under `collective_rpc`):
    correct tokens, exact first lines, parsing and empty completions, and the speed stats."""
    groups = getattr(llm, "data_parallel_size", 1)
    base = dict(options, block_length=block, temperature=0.0)
    if groups > 1:  # each set shared as `LLM.generate` shares a list
        g = llm.data_parallel_rank
        mine = llm.share([prefix for prefix, _ in samples], **base,
                         max_new_tokens=new_tokens, ignore_eos=True)[g]
        samples = [samples[i] for i in mine]
        # (the prompts' shares in the other group order: the groups' totals even out)
        mine = llm.share([prompt_cut(llm.tokenizer, p) for p in prompts], **base,
                         max_new_tokens=humaneval_tokens, stop=list(STOPS))[groups - 1 - g]
        prompts = [prompts[i] for i in mine]
    stats = dict(seconds=0.0, tokens=0, rounds=0, blocks=0)
    warm = samples[0][0] if samples else prompts[0] if prompts else None
    if warm is not None:  # untimed: captures and compiles for this block and strategy
        _generate(llm, warm, dict(base, max_new_tokens=2 * block, ignore_eos=True),
                  dict(seconds=0.0, tokens=0, rounds=0, blocks=0))
    correct = lines = 0
    for prefix, truth in samples:
        r = _generate(llm, prefix, dict(base, max_new_tokens=new_tokens, ignore_eos=True), stats)
        correct += sum(a == b for a, b in zip(r.token_ids, truth, strict=False))
        lines += first_line_match(llm.tokenizer.decode(r.token_ids),
                                  llm.tokenizer.decode(truth))
    ok = empty = 0
    for prompt in prompts:
        prompt = prompt_cut(llm.tokenizer, prompt)
        r = _generate(llm, prompt, dict(base, max_new_tokens=humaneval_tokens,
                                        stop=list(STOPS)), stats)
        wrote = bool(until_stop(r.text).strip())
        ok += wrote and parses(prompt, r.text)
        empty += not wrote
    return dict(correct=correct, lines=lines, ok=ok, empty=empty, **stats)


def run(llm, blocks: list[int], chosen: list[tuple[str, dict[str, Any]]], samples,
        prompts: list[str], new_tokens: int = 64, humaneval_tokens: int = 128,
        progress=None, done=frozenset(), on_row=None) -> list[dict[str, Any]]:
    """The rows of every (block, setting), in that order, but those in `done` ((block, label)
    pairs measured before); `on_row(row, seconds)` is called after each."""
    rows = []
    for block in blocks:
        for label, options in chosen:
            if (block, label) in done:
                continue
            t0 = time.perf_counter()
            rows.append(dict(block=block, setting=label, options=options,
                             **score(llm, block, options, samples, prompts, new_tokens,
                                     humaneval_tokens)))
            if progress is not None:
                progress.update(1)
            if on_row is not None:
                on_row(rows[-1], time.perf_counter() - t0)
    return rows


def probe(llm, block: int, options: dict[str, Any], samples, prompts: list[str],
          new_tokens: int, humaneval_tokens: int) -> tuple[float, float]:
    """Seconds of one held-out request and of one HumanEval request of a setting (0.0 for a
    set without requests), as `score` makes them, after an untimed one of two blocks."""
    base = dict(options, block_length=block, temperature=0.0)
    first = samples[0][0] if samples else prompt_cut(llm.tokenizer, prompts[0])
    _generate(llm, first, dict(base, max_new_tokens=2 * block, ignore_eos=True),
              dict(seconds=0.0, tokens=0, rounds=0, blocks=0))
    took = []
    for prompt, more in (
            (samples[0][0] if samples else None, dict(max_new_tokens=new_tokens, ignore_eos=True)),
            (prompt_cut(llm.tokenizer, prompts[0]) if prompts else None,
             dict(max_new_tokens=humaneval_tokens, stop=list(STOPS)))):
        stats = dict(seconds=0.0, tokens=0, rounds=0, blocks=0)
        if prompt is not None:
            _generate(llm, prompt, dict(base, **more), stats)
        took.append(stats["seconds"])
    return took[0], took[1]


def title(model: str, blocks: list[int], samples: int, new_tokens: int, prefix_tokens: int,
          device: str) -> str:
    """The plot's title: the model and what was measured."""
    return (f"{model}: greedy, block {', '.join(map(str, blocks))}; {samples} held-out "
            f"samples of {new_tokens} tokens after {prefix_tokens}; {device}")


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any] | None = None) -> int:
    """`dlrt bench quality`; `options`: request options every setting takes
    (`REQUEST_OPTIONS`)."""
    from dlrt import LLM, progress
    from dlrt.bench.humaneval import load_prompts
    from dlrt.bench.quality_plot import plot
    from dlrt.bench.quality_record import (
        first_estimate,
        left,
        read_record,
        resumed_rows,
        update_record,
    )
    from dlrt.bench.report import device_name
    from dlrt.checkpoint.default import default_model_path
    from dlrt.train.corpus import load_corpus

    try:
        chosen = settings(args.settings)
    except ValueError as e:
        raise OptionError(f"--settings: {e}") from None
    options = dict(options or {})
    chosen = with_options(chosen, options)
    blocks = list(args.blocks)  # positive ints, checked by the parser
    resumed = read_record(args.resume) if args.resume else None  # before the model loads
    llm = LLM(**llm_kwargs)
    if llm.tokenizer is None:
        raise OptionError("--model: bench quality needs a model with a tokenizer (held-out "
                          "text and HumanEval prompts are text)")
    model = Path(llm_kwargs.get("model") or default_model_path())
    corpus = load_corpus(args.heldout_root)
    trained_on = trained_on_python(model)
    if args.heldout_root is None:
        warning = python_mismatch(corpus.record()["python"], trained_on)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    samples = heldout_samples(llm.tokenizer, [t for _, t in corpus.held_out],
                              args.num_heldout, args.prefix_tokens, args.new_tokens, args.seed)
    prompts = ([p["prompt"] for p in load_prompts(args.data, args.num_prompts)]
               if args.num_prompts else [])
    facts = dict(model=str(model), device=device_name(llm.device),
                 execution_mode=llm.execution_mode, options=options,
                 heldout=dict(corpus.record(), samples=len(samples),
                              model_trained_on_python=trained_on,
                              prefix_tokens=args.prefix_tokens, new_tokens=args.new_tokens,
                              seed=args.seed),
                 humaneval=dict(prompts=len(prompts), max_new_tokens=args.humaneval_tokens))
    rows = resumed_rows(args.resume, facts, resumed) if args.resume else []
    done = {(r["block"], r["setting"]) for r in rows}
    todo = [(b, lb, o) for b in blocks for lb, o in chosen if (b, lb) not in done]
    if args.resume:
        path = Path(args.resume)
    else:
        name = f"quality-{str(llm_kwargs.get('model') or 'default').rstrip('/').split('/')[-1]}"
        payload = {k: v for k, v in facts.items() if k != "device"}  # write_json adds it
        path = write_json(name, dict(payload, complete=False, rows=rows), llm.device, args.out)
    say = progress.write
    say(f"bench quality: {len(todo)} setting(s) to run, {len(rows)} in the record; "
        f"writing {path} after each")
    took: list[float] = []

    def on_row(row: dict[str, Any], seconds: float) -> None:
        rows.append(row)
        took.append(seconds)
        update_record(path, rows=rows)
        say(f"[{len(took)}/{len(todo)}] block {row['block']} {row['setting']}: "
            f"{seconds:.0f} s; {left(took, len(todo) - len(took))}")

    try:
        if todo and (samples or prompts):
            heldout_s, humaneval_s = probe(llm, todo[0][0], todo[0][2], samples, prompts,
                                           args.new_tokens, args.humaneval_tokens)
            say(first_estimate(heldout_s, humaneval_s, len(todo), len(samples), len(prompts)))
        with progress.bar(len(todo), "settings", unit="setting") as bar:
            run(llm, blocks, chosen, samples, prompts, args.new_tokens, args.humaneval_tokens,
                bar, done, on_row)
    except KeyboardInterrupt:
        print(f"interrupted: {len(took)} of {len(todo)} setting(s) finished, kept in {path} "
              f"(--resume {path} runs the rest)", file=sys.stderr, flush=True)
        return 130
    update_record(path, rows=rows, complete=True)
    print(table(rows, COLUMNS + (["group_tps"] if llm.data_parallel_size > 1 else [])))
    print(f"wrote {path}")
    png = path.with_suffix(".png")
    heading = title(model.name, sorted({r["block"] for r in rows}), len(samples),
                    args.new_tokens, args.prefix_tokens, facts["device"])
    print(f"wrote {png}" if plot(rows, png, heading) else "no plot: matplotlib is not installed")
    return 0
