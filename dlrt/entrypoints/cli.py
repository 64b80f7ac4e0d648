"""The `dlrt` command line: generate, make-checkpoint, serve, bench, eval.

Decoding flags are derived from `DecodingOptions` (each default written once, there).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import re
import signal
import sys
import threading
import typing

from dlrt import __version__, env, progress
from dlrt.errors import DlrtError, OptionError

_HELP = {
    "max_new_tokens": "tokens to generate at most (default 128)",
    "block_length": "block length B (default: the model's / decoder's); for the LLaDA canvas, "
                    "B below the canvas denoises it in sub-blocks of B that stream as each "
                    "ends (one canvas block shows nothing until the whole canvas is done)",
    "denoising_steps": "round budget T per block (default B)",
    "remasking_strategy": "sequential, low_confidence_static, low_confidence_dynamic, "
                          "threshold, entropy_bounded, dynamic_pmax, random, credit, "
                          "hierarchical",
    "threshold": "confidence threshold in [0, 1] of low_confidence_dynamic, threshold (commit "
                 "every masked position with p above it, else the most confident one) and "
                 "dynamic_pmax; credit commits p >= it, hierarchical every p above it "
                 "(default: the model's, else 0.9)",
    "eb_threshold": "entropy budget of entropy_bounded (default 0.35)",
    "low_threshold": "hierarchical: a span's most confident position is committed when its p "
                     "is above X in [0, 1] (dInfer's low_threshold; default 0.4)",
    "credit_weight": "credit: weight of log(1 + credit) added to the logits, in [0, 100] "
                     "(dInfer's credit_alpha; default 0.7)",
    "credit_boost": "credit: a round adds p ** X to the credit of a masked position's "
                    "argmax token, X >= 0 (dInfer's boost_gamma; default 0.2)",
    "credit_decay": "credit: share of the credit kept from one round to the next, in [0, 1] "
                    "(dInfer's decay_beta; default 0.8)",
    "editing_threshold": "token editing (LLaDA2.1, block decoder): rewrite a decided token of "
                         "the active block when the model prefers another with probability "
                         "above X in [0, 1] (default: off)",
    "max_post_steps": "with editing: passes over a block with no mask left while edits go on "
                      "(default 16)",
    "temperature": "0 = greedy (default: generation_config.json, else 0)",
    "top_k": "top-k filter, 0 = off", "top_p": "top-p filter, 1 = off",
    "max_denoising_steps": "renoising families (DiffusionGemma): rounds per canvas at most, "
                           "in [1, 1024] (default: generation_config.json, else 48)",
    "entropy_bound": "renoising families: a round accepts the lowest-entropy positions while "
                     "their entropies minus the largest sum to at most X nats (default 0.1)",
    "t_min": "renoising families: the temperature schedule's low end (default 0.4)",
    "t_max": "renoising families: the temperature of the first round, > t_min (default 0.8)",
    "stability_threshold": "renoising families: a canvas is stable once its argmax canvas has "
                           "stayed the same for X rounds (default 1)",
    "confidence_threshold": "renoising families: a stable canvas stops once its mean entropy "
                            "is below X nats (default 0.005)",
    "canvas_cache": "LLaDA canvas decoder's approximate KV cache (Fast-dLLM): none (exact, "
                    "default), prefix (a sub-block's later rounds reuse the K/V before it), "
                    "dual (they forward the sub-block alone, reusing the K/V around it)",
    "vicinity_before": "with --canvas-cache dual: positions before the sub-block that its "
                       "later rounds recompute too (dInfer's vicinity refresh; default 0)",
    "vicinity_after": "with --canvas-cache dual: positions after the sub-block that its "
                      "later rounds recompute too (default 0)",
    "smoothing": "canvas decoder (any --canvas-cache) or block decoder (no editing); "
                 "threshold, credit or hierarchical strategy: dInfer's iteration smoothing "
                 "(masked positions also enter the next forward as the previous forward's "
                 "probability-weighted embedding; the bar decays from 1)",
    "cont_weight": "with --smoothing: the largest weight of that embedding (default 0.3)",
    "cont_weight_init": "with --smoothing: its weight in the first round (default 0.15)",
    "cont_weight_growth": "with --smoothing: its weight's growth per round (default 0.02)",
    "threshold_decay": "with --smoothing: the bar's decay per round from 1 down to "
                       "--threshold, in [0, 1] (default 0.02)",
    "seed": "sampling seed",
    "stop": "extra stop: a token id (ASCII digits only) or else a string (repeatable)",
    "ignore_eos": "do not stop at end-of-sequence tokens",
    "logprobs": "with --json: each generated token's log-probability under the distribution "
                "its round drew it from",
    "top_logprobs": "with --logprobs: that many most likely tokens beside each, in [0, 20] "
                    "(default 0)",
}


def add_decoding_flags(parser: argparse.ArgumentParser,
                       only: tuple[str, ...] | None = None) -> None:
    """One flag per `DecodingOptions` field (`only`: those fields); all default to None (= the
    model's default)."""
    from dlrt.decoding.options import DecodingOptions

    hints = typing.get_type_hints(DecodingOptions)
    for f in dataclasses.fields(DecodingOptions):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        if hint is bool:
            parser.add_argument(flag, action="store_true", default=None, help=_HELP[f.name])
        elif f.name == "stop":
            parser.add_argument(flag, action="append", default=None, help=_HELP[f.name])
        else:
            kind = next(t for t in typing.get_args(hint) if t is not type(None))
            parser.add_argument(flag, type=kind, default=None, help=_HELP[f.name])


def decoding_kwargs(args: argparse.Namespace, only: tuple[str, ...] | None = None,
                    check: bool = True) -> dict:
    """The decoding options given on the command line (`only`: those of these fields), their
    ranges checked unless `check` is False (before any model is loaded; the error names the
    flag)."""
    from dlrt.decoding.options import DecodingOptions, as_flag_error, check_ranges

    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(DecodingOptions)
          if only is None or f.name in only}
    if kw.get("stop"):
        kw["stop"] = [int(s) if re.fullmatch("[0-9]+", s) else s for s in kw["stop"]]
    kw = {k: v for k, v in kw.items() if v is not None}
    try:
        if check:
            check_ranges(DecodingOptions.from_kwargs(kw))
    except OptionError as e:
        raise as_flag_error(e) from e
    return kw


def _engine_flag(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _engine_dest(f: dataclasses.Field) -> str:
    return _engine_flag(f)[2:].replace("-", "_")


def add_engine_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per `EngineConfig` field (its default, choices and help are written there)."""
    from dlrt.engine.config import EngineConfig

    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in skip:
            continue
        flag = _engine_flag(f)
        kind = next(t for t in (typing.get_args(hints[f.name]) or (hints[f.name],))
                    if t is not type(None))
        default = "" if f.default is None else f" (default: {f.default})"
        parser.add_argument(flag, dest=_engine_dest(f), type=kind, default=f.default,
                            choices=f.metadata["choices"],
                            help=f.metadata["help"] + (default if f.name != "model" else ""))


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine options given on the command line (every `EngineConfig` field it has)."""
    from dlrt.engine.config import EngineConfig

    fields = dataclasses.fields(EngineConfig)
    return {f.name: getattr(args, _engine_dest(f)) for f in fields
            if hasattr(args, _engine_dest(f))}


def _generate(args: argparse.Namespace) -> int:
    from dlrt import LLM

    kw = decoding_kwargs(args)
    llm = LLM(**engine_kwargs(args))
    prompt = args.prompt_ids or args.prompt
    if args.json:
        result = llm.generate(prompt, chat=args.chat, **kw)
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        return 0
    ids = llm.tokenizer is None  # no text to show: the ids, a block per line
    for block in llm.stream(prompt, chat=args.chat, **kw):
        sys.stdout.write(" ".join(map(str, block.token_ids)) + "\n" if ids else block.text)
        sys.stdout.flush()
        if block.finish_reason:
            if not ids:
                sys.stdout.write("\n")
            sys.stderr.write(f"[finish_reason={block.finish_reason}]\n")
    return 0


def _make_checkpoint(args: argparse.Namespace) -> int:
    from dlrt.checkpoint.make import make_checkpoint

    out = make_checkpoint(args.source, args.out, seed=args.seed, dtype=args.dtype,
                          num_layers=args.num_layers,
                          max_shard_bytes=max(1, int(args.max_shard_gb * 10**9)),
                          device=args.device,
                          overwrite=args.overwrite, quantization=args.quantization)
    print(out)
    return 0


def _bench_humaneval(args: argparse.Namespace) -> int:
    from dlrt.bench import humaneval

    kw = decoding_kwargs(args)
    return humaneval.main(args, engine_kwargs(args), kw)


def _bench_quality(args: argparse.Namespace) -> int:
    from dlrt.bench import quality

    # NOTE: checked with each setting's strategy (`quality.with_options`)
    options = decoding_kwargs(args, only=quality.REQUEST_OPTIONS, check=False)
    return quality.main(args, engine_kwargs(args), options)


def _bench_serve(args: argparse.Namespace) -> int:
    from dlrt.bench import serve

    return serve.main(args, engine_kwargs(args), decoding_kwargs(args))


def _bench_step(args: argparse.Namespace) -> int:
    from dlrt.bench import canvas_step, step

    bench = canvas_step if args.prompt_lengths else step
    return bench.main(args, engine_kwargs(args), decoding_kwargs(args))


def _bench_memory(args: argparse.Namespace) -> int:
    from dlrt.bench import memory

    return memory.main(args, engine_kwargs(args), decoding_kwargs(args))


def _bench_kernels(args: argparse.Namespace) -> int:
    from dlrt.bench import kernels

    return kernels.main(args, engine_kwargs(args))


def _bench_accuracy(args: argparse.Namespace) -> int:
    from dlrt.bench import accuracy

    return accuracy.main(args, engine_kwargs(args))


def _eval(args: argparse.Namespace) -> int:
    from dlrt.eval import cli

    return cli.main(args.harness_args)


def _serve(args: argparse.Namespace) -> int:
    from dlrt.server.serve import serve

    logging.getLogger("dlrt").setLevel(logging.INFO)
    return serve(engine_kwargs(args), decoding_kwargs(args), args.host, args.port,
                 args.max_queue, args.request_timeout, args.max_body_bytes,
                 served_model_name=args.served_model_name,
                 api_key=env.api_key() if args.api_key is None else args.api_key)


def _token_ids(text: str) -> list[int]:
    parts = text.replace(",", " ").split()
    if not parts or not all(re.fullmatch("[0-9]+", p) for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected token ids (digits) separated by commas or spaces, got {text!r}")
    return [int(p) for p in parts]


def _positive(kind: type) -> typing.Callable[[str], int | float]:
    """An argparse type: a finite `kind` number > 0."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"expected a finite {kind.__name__} > 0, "
                                             f"got {text!r}")
        return value
    return parse


def _int_in(low: int, high: int | None = None) -> typing.Callable[[str], int]:
    """An argparse type: an int in [low, high] (no upper bound when `high` is None)."""
    want = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value
    return parse


def _positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated ints > 0 ("4,8")."""
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch("[0-9]+", p) and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, "
                                         f"got {text!r}")
    return [int(p) for p in parts]


_port = _int_in(1, 65535)


def add_out_flag(parser: argparse.ArgumentParser) -> None:
    """A benchmark's `--out`: the folder of its JSON record (default: the ignored runs
    folder)."""
    from dlrt.bench.report import BENCH_OUT

    parser.add_argument("--out", default=BENCH_OUT,
                        help=f"folder for the JSON record (default: {BENCH_OUT})")


def add_prompt_flags(parser: argparse.ArgumentParser) -> None:
    """The HumanEval request flags of `bench humaneval` and `bench serve`."""
    parser.add_argument("--data", default=None,
                        help="humaneval.jsonl (default: the 164 problems shipped with dlrt)")
    parser.add_argument("--num-prompts", type=_positive(int), default=8,
                        help="the first N problems (default 8)")
    parser.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    add_out_flag(parser)


class _Parser(argparse.ArgumentParser):
    """argparse with one `error:` line for a bad flag (not the usage block), exit status 2;
    every subcommand's parser is one too (argparse makes them of the parent's class)."""

    def error(self, message: str) -> typing.NoReturn:
        hint = f"`{self.prog} --help` lists its flags" if self.prog != "dlrt" else \
            "`dlrt --help` lists the commands, `dlrt COMMAND --help` their flags"
        sys.stderr.write(f"error: {self.prog}: {message} ({hint})\n")
        raise SystemExit(2)


@contextlib.contextmanager
def _interrupt_after():
    """Hold SIGINT (Ctrl-C) until the block ends, then raise it (KeyboardInterrupt) there: an
    interrupt in the middle of an import leaves half-made modules behind (numpy then refuses
    to load again, or the interrupt is lost inside library code). Main thread, POSIX only."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = mask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, before)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dlrt", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dlrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for one prompt")
    add_engine_flags(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", type=_token_ids,
                     help="prompt as token ids, comma or space separated")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--json", action="store_true", help="print the whole result as JSON")
    add_decoding_flags(gen)
    gen.set_defaults(func=_generate)

    from dlrt.checkpoint.make import write_choices
    from dlrt.checkpoint.presets import PRESETS, real_configs

    mk = sub.add_parser("make-checkpoint",
                        help="write a checkpoint with seeded random weights")
    mk.add_argument("source", help=f"a preset ({', '.join(PRESETS)}), a shipped real config "
                                   f"({', '.join(real_configs())}) or a folder with config.json")
    mk.add_argument("out", help="destination folder")
    mk.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    mk.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16 or float32")
    mk.add_argument("--num-layers", type=int, default=None,
                    help="keep only this many layers (at most the config's number)")
    mk.add_argument("--max-shard-gb", type=_positive(float), default=5.0,
                    help="shard size limit in GB (default 5)")
    mk.add_argument("--device", default="cpu",
                    help="where to draw the random values: cpu (default) or cuda")
    mk.add_argument("--overwrite", action="store_true",
                    help="replace OUT if it is a checkpoint folder (never another folder)")
    mk.add_argument("--quantization", default="none", choices=write_choices(),
                    help="write the linear layers and experts (not the LM head) quantised: fp8 "
                         "(HF block-scaled, 128x128 e4m3, scale = amax/448) or nvfp4 (ModelOpt "
                         "layout, groups of 16); default none")
    mk.set_defaults(func=_make_checkpoint)

    sv = sub.add_parser("serve", help="HTTP server: NDJSON /generate, OpenAI-compatible "
                                      "endpoints and Anthropic's /v1/messages (torchrun for "
                                      "several ranks)")
    add_engine_flags(sv)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=_port, default=18080)
    sv.add_argument("--max-queue", type=_int_in(0), default=16,
                    help="requests that may wait while one runs (one per data-parallel group; "
                         "0: none); more get 503 with Retry-After")
    sv.add_argument("--request-timeout", type=_positive(float), default=600.0,
                    help="seconds before a request ends with finish_reason 'timeout'")
    sv.add_argument("--max-body-bytes", type=_positive(int), default=1 << 20,
                    help="larger request bodies get 413")
    sv.add_argument("--served-model-name", default=None, metavar="NAME",
                    help="the model name of the OpenAI endpoints: /v1/models lists it, requests "
                         "naming another model get 404 (default: the --model folder's name; "
                         "dlrt-default for the embedded default model)")
    sv.add_argument("--api-key", default=None, metavar="KEY",
                    help="ask for 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every "
                         "endpoint but /health (401 otherwise); default $DLRT_API_KEY, unset: "
                         "no key")
    add_decoding_flags(sv)
    sv.set_defaults(func=_serve)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench",
                                                                      required=True)
    he = bench.add_parser("humaneval", help="generate on HumanEval prompts: round latency, "
                                            "TPF, TPS")
    add_engine_flags(he)
    add_prompt_flags(he)
    add_decoding_flags(he)
    he.add_argument("--modes", default=None,
                    help="compare execution modes in one run, e.g. device_loop,host_loop,eager")
    he.set_defaults(func=_bench_humaneval)

    bs = bench.add_parser("serve", help="HumanEval prompts through LLM.stream and through "
                                        "`dlrt serve` over HTTP: time to first block, TPS")
    add_engine_flags(bs)
    add_prompt_flags(bs)
    add_decoding_flags(bs)
    bs.add_argument("--port", type=_port, default=None, help="server port (default: a free one)")
    bs.add_argument("--startup-timeout", type=_positive(float), default=1800.0,
                    help="seconds to wait for the server's /health (default 1800)")
    bs.set_defaults(func=_bench_serve)

    st = bench.add_parser("step", help="round latency per context: device loop, replay, host "
                                       "loop, eager, HBM floor")
    add_engine_flags(st, skip=("execution_mode",))
    where = st.add_mutually_exclusive_group()
    where.add_argument("--context", default="0,1024,4096,16384",
                       help="comma-separated context lengths")
    where.add_argument("--prompt-lengths", type=_positive_ints, default=None,
                       help="the canvas decoder (LLaDA): comma-separated prompt lengths, the "
                            "canvas each prompt plus --max-new-tokens; per length the exact "
                            "round, with --smoothing the smoothed one, with --canvas-cache its "
                            "refresh and window rounds, each against its own HBM floor and "
                            "over the exact round")
    st.add_argument("--rounds", type=int, default=100, help="rounds per timing")
    add_out_flag(st)
    add_decoding_flags(st)
    st.set_defaults(func=_bench_step)

    bm = bench.add_parser("memory", help="memory held awake, after sleep(1) and after "
                                         "sleep(2); sleep and wake times; tokens after each "
                                         "wake against those before")
    add_engine_flags(bm)
    add_out_flag(bm)
    add_decoding_flags(bm)
    bm.set_defaults(func=_bench_memory)

    bk = bench.add_parser("kernels", help="fused small ops vs PyTorch and torch.compile, "
                                          "projections' bandwidth, at a model's shapes")
    add_engine_flags(bk, skip=("execution_mode", "max_model_len", "kernels"))
    bk.add_argument("--rows", type=_positive(int), default=4, help="rows N (the block length)")
    add_out_flag(bk)
    bk.set_defaults(func=_bench_kernels)

    bq = bench.add_parser("quality", help="per remasking strategy and block length: held-out "
                                          "continuation accuracy, HumanEval parse rate, TPF, "
                                          "rounds per block, TPS; table, JSON, PNG")
    add_engine_flags(bq)
    bq.add_argument("--settings", default=None,
                    help="comma-separated setting labels or strategy names (default: all; "
                         "see dlrt.bench.quality.SETTINGS)")
    bq.add_argument("--blocks", type=_positive_ints, default="4,8",
                    help="comma-separated block lengths (default 4,8)")
    bq.add_argument("--num-heldout", type=_positive(int), default=32,
                    help="held-out continuation samples (default 32)")
    bq.add_argument("--heldout-root", default=None,
                    help="folder of .py files whose held-out split is used (default: this "
                         "Python's standard library, the default model's corpus)")
    bq.add_argument("--prefix-tokens", type=_positive(int), default=256,
                    help="tokens of held-out prefix (default 256)")
    bq.add_argument("--new-tokens", type=_positive(int), default=64,
                    help="continuation tokens compared (default 64)")
    bq.add_argument("--data", default=None,
                    help="humaneval.jsonl (default: the 164 problems shipped with dlrt)")
    bq.add_argument("--num-prompts", type=_int_in(0), default=164,
                    help="HumanEval prompts (default 164; 0: none)")
    bq.add_argument("--humaneval-tokens", type=_positive(int), default=128,
                    help="new tokens per HumanEval completion at most (default 128)")
    bq.add_argument("--seed", type=int, default=0, help="held-out sample selection seed")
    bq.add_argument("--resume", default=None, metavar="RECORD",
                    help="a record of an unfinished run (of the same model, device and "
                         "samples): run the settings it lacks and write them into it")
    bq.add_argument("--quiet", action="store_true", help="no progress bar")
    from dlrt.bench.quality import REQUEST_OPTIONS

    add_decoding_flags(bq, only=REQUEST_OPTIONS)  # given to every setting's requests
    add_out_flag(bq)
    bq.set_defaults(func=_bench_quality)

    ba = bench.add_parser("accuracy", help="FP8 / NVFP4 logits of one prefill forward against "
                                           "the dequantised weights and the unquantised model")
    add_engine_flags(ba, skip=("execution_mode", "max_model_len", "quantization",
                               "fp8_activations"))
    ba.add_argument("--quantization", default="fp8,fp8-weight_only,nvfp4",
                    help="comma-separated precisions: fp8 (dynamic activations), "
                         "fp8-weight_only, nvfp4 (default: all three)")
    ba.add_argument("--num-tokens", type=_positive(int), default=64,
                    help="prompt positions of the forward (default 64)")
    ba.add_argument("--num-layers", type=_positive(int), default=None,
                    help="keep only the first L layers (with --load-format dummy)")
    add_out_flag(ba)
    ba.set_defaults(func=_bench_accuracy)
    for command in (*sub.choices.values(), *bench.choices.values()):
        if "--quiet" not in command._option_string_actions:
            command.add_argument("--quiet", action="store_true",
                                 help="no progress bars (they show only on a terminal)")
    ev = sub.add_parser("eval", add_help=False, prefix_chars="\0",
                        help="lm-evaluation-harness with the dlrt model: `dlrt eval --model dlrt "
                             "--model_args pretrained=PATH --tasks ...` takes lm_eval's "
                             "arguments (`dlrt eval --help` lists them)")
    ev.add_argument("harness_args", nargs=argparse.REMAINDER)
    ev.set_defaults(func=_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit code: 0, 2 (a named error: one `error:` line on stderr; some
    errors carry their own code, as `dlrt serve`'s address in use: 3), 130 (interrupted:
    Ctrl-C, one line on stderr), or the command's own (a `bench` check that failed: 1)."""
    try:
        logging.basicConfig(level=logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        args = build_parser().parse_args(argv)
        progress.set_quiet(getattr(args, "quiet", False))
        with _interrupt_after():  # the libraries every command loads, whole or not at all
            import transformers  # noqa: F401

            import dlrt.llm  # noqa: F401
        return args.func(args)
    except BaseException as e:
        if _interrupted(e):
            # NOTE: an interrupt inside an exec of a string (dataclasses build their methods
            # so) marks the interpreter to end by SIGINT whatever main returns; an exec that
            # completes clears the mark
            exec("")
            # NOTE: on a terminal the cursor stands after the echoed ^C
            sys.stderr.write("\ninterrupted\n" if sys.stderr.isatty() else "interrupted\n")
            return 130
        if not isinstance(e, DlrtError):
            raise
        sys.stderr.write(f"error: {e}\n")  # one write: ranks' lines do not interleave
        return getattr(e, "exit_code", 2)


def _interrupted(error: BaseException | None) -> bool:
    """Whether `error` is a KeyboardInterrupt or was raised by one: CPython wraps one raised
    in a class's `__set_name__` in a RuntimeError, and clean-up code may fail on its way out."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
