"""`LLM`: load a block-diffusion checkpoint and generate from Python."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import pickle
import random
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from dlrt.attention.registry import check_backend
from dlrt.checkpoint.update import portable
from dlrt.decoding.ignored import warn_ignored
from dlrt.decoding.options import (
    DEFAULT_MAX_NEW_TOKENS,
    DecodingOptions,
    DecodingParams,
    check_canvas_cache,
    check_editing,
    check_smoothing,
    resolve,
)
from dlrt.distributed.calls import Calls, OutOfStep, Request, on_rank
from dlrt.distributed.data_parallel import alongside, outcomes, share_by_cost
from dlrt.distributed.links import lead
from dlrt.distributed.ranks import Ranks, process_rank, world_size
from dlrt.engine.config import EngineConfig
from dlrt.engine.engine import Engine
from dlrt.engine.lifecycle import check_level
from dlrt.errors import DlrtError, OptionError, PromptError
from dlrt.models.registry import family
from dlrt.outputs import BlockOutput, GenerationResult
from dlrt.runtime.executor import check_mode
from dlrt.stops import find_stop_string, stop_holdback, trim
from dlrt.tokenizer import Prompt, TextStream, encode_prompt, is_prompt_list

FOLLOWED = frozenset({"_follow_request", "_set_execution_mode", "_collective_rpc", "_sleep",
                      "_wake_up", "_update_weights"})
_MADE_UNDER_TORCHRUN: list[bool] = []  # [True] once this torchrun process made its LLM

log = logging.getLogger(__name__)


def _engine(path: str, doc: str) -> property:
    """A read-only attribute of the engine (a dotted path)."""
    def get(llm: LLM):
        obj = llm.engine
        for name in path.split("."):
            obj = getattr(obj, name)
        return obj
    return property(get, doc=doc)


class LLM:
    """A loaded model ready to generate, one request at a time.

    Args:
        model: checkpoint folder (Hugging Face layout, safetensors only); None = the embedded
            default: a 7.6M-parameter SDAR model trained on the Python standard library, with
            its own byte-level BPE tokenizer, shipped as package data
            (`dlrt/data/sdar-stdlib-8m`).
        **options: engine options, the fields of `dlrt.engine.config.EngineConfig` (each
            documented there, as the CLI's engine flags are): dtype, device, load_format,
            seed (of dummy weights), max_model_len, decoder, mask_token_id, execution_mode,
            attention_backend, quantization, fp8_activations, kv_cache_dtype, kernels,
            round_kernel, tensor_parallel_size, data_parallel_size, linear_kernels,
            cpu_threads. None = the default.
    Raises:
        CheckpointError, ConfigError, OptionError: the message names the problem; a bad
            option fails before the checkpoint is read. Under torchrun the message starts
            with "rank R: ".

    Under torchrun (one process per rank, every rank running the same script) `LLM(...)`
    loads the model on every rank (cut across them: tensor parallelism), then only rank 0
    returns. Every other rank serves rank 0's calls until rank 0's LLM closes and then ends
    its process (exit status 0; non-zero with a one-line message when rank 0 is gone or the
    ranks fall out of step). Rank 0's `generate` / `stream` (checked there first: the other
    ranks never see a bad request), `set_execution_mode`, `collective_rpc`, `sleep`, `wake_up`,
    `update_weights` and `close` run on every rank. After each block every rank reports its
    status: a failure on any rank ends the request on every rank (rank 0's caller gets the
    rank's own error, or `RankError` naming the rank that failed; the others log it) and the
    next request starts in step.
    One LLM per torchrun job. `close()` (also: the end of a `with LLM(...) as llm:` block,
    and for an LLM still open, its collection or the end of the process) releases the ranks'
    buffers in rank order and leaves the process group.

    With `data_parallel_size` D the job's ranks form D groups of consecutive ranks, each a whole
    engine led by its first rank (`dlrt.distributed.data_parallel`). Rank 0's calls above run
    on its own group; `generate` with a list of prompts shares them among the groups
    (`share`), `collective_rpc`, `set_execution_mode`, `sleep`, `wake_up`, `update_weights`
    and `close` reach every group (each group checks and applies them on its own ranks; the
    first group's error is raised), and `dlrt serve` hands requests to this LLM and its
    `other_groups`. A group that fails a request reports it for that request only and goes on.
    """

    def __init__(self, model: str | Path | None = None, **options: Any):
        world = world_size()
        if world > 1 and _MADE_UNDER_TORCHRUN:
            raise OptionError("one LLM per torchrun job: the other ranks follow the first LLM "
                              "and end when it closes")
        try:
            self.engine = Engine.create(EngineConfig.from_kwargs(model=model, **options))
        except DlrtError as e:
            if world == 1:
                raise
            raise on_rank(e, process_rank()) from e
        if world > 1:
            _MADE_UNDER_TORCHRUN.append(True)
        self._request = 0  # id of the request allowed to run
        self._calls = Calls(self.engine.tp.control or (Ranks() if world > 1 else None))
        self._dp = self.engine.dp
        # NOTE: closes on `close()`, or when the LLM is collected, or at exit if still open;
        # it holds the channels and the groups, not the LLM
        self._close = weakref.finalize(self, self._dp.close_all, self._calls,
                                       self.engine.tp.close)
        if not self._calls.leader:
            self._follow()
        elif self._dp.link is not None:
            self._lead()

    def _follow(self) -> None:
        """A rank other than its group's first: run the group leader's calls until it closes,
        then end the process."""
        rank, leader = self._calls.me, self._calls.first
        log.info("rank %d following rank %d", rank, leader)
        try:
            self._calls.follow(self, FOLLOWED)
        except OutOfStep as e:
            raise SystemExit(" ".join(str(e).split())) from None
        log.info("rank %d closed with rank %d", rank, leader)
        raise SystemExit(0)

    def _lead(self) -> None:
        """The leader of a data-parallel group other than rank 0's: run on this group what
        rank 0 hands it (`dlrt.distributed.links`) until rank 0 closes, then end the
        process."""
        rank = self._calls.me
        log.info("rank %d leading data-parallel group %d", rank, self._dp.index)
        try:
            lead(self._dp.link, self)
        except OutOfStep as e:
            raise SystemExit(" ".join(str(e).split())) from None
        log.info("rank %d closed with rank 0", rank)
        raise SystemExit(0)

    def close(self) -> None:
        """Close on every rank (rank 0 tells the others, the other data-parallel groups'
        leaders first; they end their processes after):
        release the ranks' buffers (the peer-to-peer all-reduce's, in rank order) and leave
        the process group. Later `close` calls do nothing. After it, the calls that run the
        model (`generate`, `stream`, `set_execution_mode`, `collective_rpc`, `sleep`, `wake_up`,
        `update_weights`) raise DlrtError;
        those that read only the host (`check`, `encode`, `resolve`, `max_new_tokens_fit`,
        the attributes) still answer.
        """
        if not self._close.alive:
            return
        if self._calls.in_step:
            raise DlrtError("close() inside collective_rpc: close from rank 0's code")
        self._close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self, what: str) -> None:
        """Raises DlrtError when closed, AsleepError naming `what` while asleep."""
        self._check_not_closed()
        self.engine.check_awake(what)

    def _check_not_closed(self) -> None:
        if not self._close.alive:
            raise DlrtError("this LLM is closed")

    @property
    def world_size(self) -> int:
        """The processes this LLM runs on (torchrun's ranks, every data-parallel group's; 1
        without torchrun)."""
        return self._calls.world * self._dp.size

    @property
    def lost(self) -> str | None:
        """Why this LLM can run no more requests (under torchrun: the ranks lost step, or
        another rank stopped, in its group or another data-parallel group's leader; every
        later request raises), or None while it can."""
        return self._calls.lost or self._dp.lost

    @property
    def data_parallel_size(self) -> int:
        """The data-parallel groups (1: none)."""
        return self._dp.size

    @property
    def data_parallel_rank(self) -> int:
        """This rank's data-parallel group (0 on rank 0)."""
        return self._dp.index

    @property
    def other_groups(self) -> list[Any]:
        """On rank 0 with data parallelism, a handle on each other group, in group order
        (`dlrt.distributed.links.RemoteGroup`: `stream`, `generate`, `lost`), whose leader
        runs the call on its group; else none. A server hands requests to this LLM (its own
        group) and to them."""
        return list(self._dp.remotes)

    @property
    def _hands_out(self) -> bool:
        """Rank 0 outside collective_rpc with data parallelism: its calls reach every group."""
        return bool(self._dp.remotes) and not self._calls.in_step

    def _on_groups(self, name: str, *args: Any, **kwargs: Any) -> list[Future]:
        """`name(*args, **kwargs)` started on every other data-parallel group (its leader's
        LLM) when this LLM hands out calls; their futures."""
        if not self._hands_out:
            return []
        return [r.submit(r.call, name, *args, **kwargs) for r in self._dp.remotes]

    # -- what was loaded (read-only views of the engine) ----------------------------------
    @property
    def engine_config(self) -> EngineConfig:
        """The resolved engine options (no "auto" left), with the execution mode in use
        (`set_execution_mode` switches it)."""
        return dataclasses.replace(self.engine.config, execution_mode=self.executor.mode)

    config = _engine("model_config", "the checkpoint's ModelConfig (with the mask token used)")
    tokenizer = _engine("tokenizer", "the checkpoint's tokenizer, or None")
    folder = _engine("folder", "the checkpoint folder")
    model = _engine("model", "the model (plain PyTorch modules)")
    runner = _engine("runner", "one forward against the KV cache")
    kv_cache = _engine("runner.cache", "the paged KV cache (its dtype; FP8: per-layer scales)")
    executor = _engine("executor", "runs block programs in the execution mode")
    decoder = _engine("decoder", "the block loop")
    decoder_defaults = _engine("decoder_defaults", "the decoder's default options")
    eos_token_ids = _engine("eos_token_ids", "the stop ids a request stops at by default")
    linear_plan = _engine("linear_plan", "each linear layer's method and its timings")
    decoder_name = _engine("config.decoder", "the decoder's name")
    device = _engine("config.torch_device", "the torch device")
    dtype = _engine("config.torch_dtype", "the torch dtype")
    max_model_len = _engine("config.max_model_len", "the context limit in tokens")
    attention_backend = _engine("config.attention_backend", "the attention backend's name")
    execution_mode = _engine("executor.mode", "device_loop, host_loop or eager")

    def set_execution_mode(self, mode: str) -> None:
        """Switch between "device_loop", "host_loop" and "eager" (benchmarks compare them on
        one loaded model). Captured graphs are kept per mode.

        Raises:
            OptionError: a mode this device or attention backend cannot run, or device_loop
                with tensor parallelism over NCCL.
        """
        self._check_open("set_execution_mode")
        if self._calls.sharing or self._hands_out:
            self._check_mode(mode)  # before the other ranks hear of it
        self._calls.call("_set_execution_mode", mode)
        others = self._on_groups("set_execution_mode", mode)
        alongside(others, self._set_execution_mode, mode)

    def _set_execution_mode(self, mode: str) -> None:
        self._calls.collective(f"set_execution_mode({mode!r})", self._check_mode, mode)
        self.executor.mode = mode

    def _check_mode(self, mode: str) -> None:
        check_mode(mode, self.device)
        check_backend(self.attention_backend, self.device, self.dtype, mode)
        tp = self.engine.tp
        if mode == "device_loop" and tp.size > 1 and self.device.type == "cuda" \
                and tp.reducer is None:
            raise OptionError("device_loop with tensor parallelism needs the peer-to-peer "
                              "all-reduce, which these GPUs cannot use (NCCL cannot run inside "
                              "a WHILE body); use host_loop or eager")

    def collective_rpc(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """`fn(llm, *args, **kwargs)` on every rank (under torchrun; else here): every rank's
        result in rank order (one process: [result]); with data parallelism every group's
        ranks, each group running its own requests. `fn` is a module-level function (sent
        by reference, with its arguments and results pickled); it must make the same LLM calls
        on every rank (inside it, `generate` / `stream` run on each rank without being sent,
        every rank taking rank 0's prompt and options). Benchmarks use it for per-rank timings.

        Raises:
            OptionError: `fn` or its arguments cannot be sent (a lambda, a local function).
            RankError: `fn` failed on another rank (named); its own error on this rank.
        """
        self._check_open("collective_rpc")
        try:
            pickle.dumps((fn, args, kwargs) if self._calls.sharing or self._hands_out else fn)
        except Exception as e:
            raise OptionError(f"collective_rpc sends fn and its arguments to every rank: "
                              f"{getattr(fn, '__qualname__', fn)!r} cannot be pickled ({e}); "
                              "pass a module-level function") from e
        self._calls.call("_collective_rpc", fn, args, kwargs)
        others = self._on_groups("collective_rpc", fn, *args, **kwargs)
        mine, theirs = alongside(others, self._collective_rpc, fn, args, kwargs)
        return mine + [value for values in theirs for value in values]

    def _collective_rpc(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
        what = f"collective_rpc({getattr(fn, '__qualname__', fn)})"
        return self._calls.collective(what, fn, self, *args, **kwargs)

    # -- RL loops: sleep, wake and in-place weight updates (vLLM's names) ------------------
    @property
    def is_sleeping(self) -> bool:
        """Whether `sleep` put this LLM to sleep (until `wake_up`)."""
        return self.engine.sleep_level > 0

    def sleep(self, level: int = 1) -> None:
        """Give the device memory back while the LLM is idle (every rank together): the KV
        cache, the captured graphs, every program's buffers and workspace are freed; level 1
        moves the weights to CPU memory (pinned on a CUDA machine), level 2 drops them
        (`dlrt.engine.sleep`). Until `wake_up`, the calls that run the model (`generate`,
        `stream`, `set_execution_mode`, `collective_rpc`) raise AsleepError; `update_weights`
        brings dropped weights back (level 2; the LLM sleeps on); `close` closes.

        Raises:
            OptionError: a level other than 1 or 2. AsleepError: already asleep.
            DlrtError: the LLM is closed.
        """
        self._check_not_closed()
        check_level(level)
        self.engine.check_awake(f"sleep(level={level})")
        self._calls.call("_sleep", level)
        alongside(self._on_groups("sleep", level), self._sleep, level)

    def _sleep(self, level: int) -> None:
        self._calls.collective(f"sleep(level={level})", self.engine.sleep, level)

    def wake_up(self, path: str | Path | None = None) -> None:
        """Take the device memory back (every rank together): the weights return from CPU
        memory, the KV cache is allocated again, and graphs are captured again on first use;
        generation then gives the tokens it gave before sleeping. `path`: a checkpoint folder
        (safetensors) whose weights the LLM wakes with (strict, as `update_weights(path)`):
        needed after `sleep(level=2)` unless `update_weights` brought weights back. Awake:
        nothing to wake (a `path`'s weights are loaded).

        Raises:
            AsleepError: no `path` while the weights of level 2 are dropped.
            WeightsError: the folder's weights do not fit (nothing changed: the LLM sleeps
                on), or a copy failed (named).
            CheckpointError: an unreadable folder. DlrtError: the LLM is closed.
            OptionError: a `path` that is not a str or path (e.g. a level number).
        """
        self._check_not_closed()
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise OptionError(f"wake_up(path=...): a checkpoint folder (str or path), got "
                              f"{type(path).__name__} {path!r:.40}; wake_up() takes no level")
        if path is None:
            self.engine.plan_wake(None)  # (checked before the other ranks hear of it)
        path = None if path is None else str(path)
        self._calls.call("_wake_up", path)
        alongside(self._on_groups("wake_up", path), self._wake_up, path)

    def _wake_up(self, path: str | Path | None) -> None:
        pending = []
        try:
            self._calls.collective("wake_up (checking the weights)",
                                   lambda: pending.append(self.engine.plan_wake(path)))
            self._calls.collective("wake_up", self.engine.wake_up, pending[0])
        finally:
            for update in pending:
                if update is not None:
                    update.close()

    def update_weights(self, weights: Any, strict: bool = True) -> None:
        """Copy new weights into the model in place (`param.data.copy_`), so captured graphs
        stay valid and the next request uses them with no recapture (`dlrt.checkpoint.update`).

        Args:
            weights: by the names of the family's Hugging Face checkpoint, as a trainer's
                `state_dict()` has them: a mapping or an iterable of (name, tensor), a
                `torch.nn.Module` of the family (e.g. a transformers model: its
                `state_dict()`), or a checkpoint folder (safetensors only). Any
                floating-point dtype is cast to the parameter's; quantised layers re-quantise
                the high-precision weight with their format's quantiser (a quantised
                folder's stored tensors are read as stored). Merged projections, stacked
                experts (per expert, or transformers' fused `gate_up_proj` / `down_proj`),
                tied parameters (any of their names) and tensor-parallel slices (each rank
                takes its own slice of the full tensors) are handled as the loader handles
                them. Under torchrun rank 0's weights reach every rank over the control
                channel (host memory; a folder: only its path); with data parallelism,
                every group's, over the link to its leader.
            strict: every weight must be given (else those not given keep their values;
                after `sleep(level=2)` every weight must be given anyway).
        Raises:
            WeightsError: unknown names, missing names (strict), wrong shapes, dtypes that
                cannot be cast (integer, bool, complex; float8 for an unquantised layer),
                all listed; nothing is updated on any rank. A copy that fails after the
                checks (an unreadable file) says the weights are partly updated.
            AsleepError: asleep at level 1 (wake first, or `wake_up(path)`).
            CheckpointError: an unreadable folder. DlrtError: the LLM is closed.
            OptionError: `strict` not a bool.
        """
        self._check_not_closed()
        if not isinstance(strict, bool):
            raise OptionError(f"update_weights: strict must be True or False, got {strict!r:.40}")
        self.engine.check_updatable()
        if self._calls.sharing or self._hands_out:
            weights = portable(weights)  # what every rank receives, rank 0 included
        self._calls.call("_update_weights", weights, strict)
        alongside(self._on_groups("update_weights", weights, strict), self._update_weights,
                  weights, strict)

    def _update_weights(self, weights: Any, strict: bool) -> None:
        pending = []
        try:
            self._calls.collective("update_weights (checking the weights)",
                                   lambda: pending.append(self.engine.plan_update(weights,
                                                                                  strict)))
            self._calls.collective("update_weights", self.engine.apply_update, pending[0])
        finally:
            for update in pending:
                update.close()

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids of a prompt (see `dlrt.tokenizer.encode_prompt`)."""
        return encode_prompt(self.tokenizer, prompt, self.config.vocab_size, chat)

    def resolve(self, options: DecodingOptions) -> DecodingParams:
        """Resolve per-request options against this model's defaults.

        Raises:
            OptionError: a bad option; a stop id outside the vocabulary; a stop string for a
                checkpoint without a tokenizer (it could never match); editing_threshold for
                a family that does not edit (only LLaDA2 does) or a decoder other than block;
                canvas_cache "prefix" or "dual" with a decoder other than canvas; smoothing
                with a decoder other than canvas or block, a strategy outside
                `SMOOTHING_STRATEGIES`, or editing.
        """
        vocab = self.config.vocab_size
        for s in options.stop:
            if isinstance(s, int) and not 0 <= s < vocab:
                raise OptionError(f"stop token id {s} is not in the vocabulary [0, {vocab})")
            if isinstance(s, str) and self.tokenizer is None:
                raise OptionError(f"stop string {s!r} needs a tokenizer and {self.folder.path} "
                                  "has none; give stop token ids")
        params = resolve(options, self.decoder_defaults, self.folder.generation_config,
                         self.eos_token_ids, DEFAULT_MAX_NEW_TOKENS, random.randrange(2**31))
        fam = family(self.config.family)
        check_editing(params, fam.name, fam.supports_editing, self.decoder_name)
        check_canvas_cache(params, self.decoder_name)
        check_smoothing(params, self.decoder_name)
        return params

    def stream(self, prompt: Prompt, *, chat: bool = False,
               defaults: dict[str, Any] | None = None, **options: Any
               ) -> Iterator[BlockOutput]:
        """Generate, yielding one `BlockOutput` per decided block. Options as `generate`;
        `defaults`: options (the same names) for those that `options` leaves unset, such as
        a server's flags; only `options` are named when they have no effect on the request."""
        yield from self._stream(prompt, chat, options, {}, defaults or {})

    def generate(self, prompt: Prompt | list[Prompt], max_new_tokens: int | None = None, *,
                 chat: bool = False, **options: Any
                 ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt, or for each of a list of prompts.

        Args:
            prompt: text, a list of chat messages ({"role", "content"}; through the chat
                template), or a list of token ids. Text goes through the chat template too
                when `chat=True`. A list of prompts (texts, message lists or token id lists)
                returns a list of results in the same order (`_generate_list`).
            max_new_tokens and **options: see `dlrt.decoding.options.DecodingOptions`
                (block_length, denoising_steps, remasking_strategy, threshold, eb_threshold,
                low_threshold, credit_weight, credit_boost, credit_decay, editing_threshold,
                max_post_steps, temperature, top_k, top_p; for renoising families:
                max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
                confidence_threshold; canvas_cache, vicinity_before, vicinity_after for the
                LLaDA canvas decoder; smoothing, cont_weight, cont_weight_init,
                cont_weight_growth, threshold_decay for it and the block decoder; seed, stop,
                ignore_eos; logprobs, top_logprobs).
        Raises:
            OptionError: unknown option or bad value. PromptError: bad or too long prompt.
        """
        if is_prompt_list(prompt):
            return self._generate_list(list(prompt), max_new_tokens, chat, options)
        stats: dict[str, Any] = {}
        blocks = list(self._stream(prompt, chat, {**options, "max_new_tokens": max_new_tokens},
                                   stats))
        tokens = [t for b in blocks for t in b.token_ids]
        last = blocks[-1]
        return GenerationResult(
            text="".join(b.text for b in blocks), token_ids=tokens,
            prompt_token_ids=stats["prompt"], denoise_steps=[b.rounds for b in blocks],
            commit_rounds=[r for b in blocks for r in b.commit_rounds],
            finish_reason=last.finish_reason, stop_reason=last.stop_reason,
            request_tps=len(tokens) / max(stats["total_s"], 1e-9), timings=stats["timings"],
            logprobs=None if last.logprobs is None else [x for b in blocks for x in b.logprobs])

    def share(self, prompts: list[Prompt], *, chat: bool = False, **options: Any
              ) -> list[list[int]]:
        """Which data-parallel group runs which of `prompts` when `generate` gets them as a
        list: per group (`data_parallel_size` lists; without data parallelism one), the
        indices into `prompts` it runs, ascending. Taken longest first by estimated cost
        (prompt tokens + max_new_tokens), each to the group whose share costs least so far
        (`dlrt.distributed.data_parallel.share_by_cost`). Options as `generate`.

        Raises:
            OptionError, PromptError: as `check`, for the first prompt it refuses (a
                PromptError names the prompt's index).
        """
        costs = []
        for i, prompt in enumerate(prompts):
            try:
                ids, params = self.check(prompt, chat=chat, **options)
            except PromptError as e:
                raise PromptError(f"prompt {i}: {e}") from e
            costs.append(len(ids) + params.max_new_tokens)
        return share_by_cost(costs, self._dp.size)

    def _generate_list(self, prompts: list[Prompt], max_new_tokens: int | None, chat: bool,
                       options: dict[str, Any]) -> list[GenerationResult]:
        """`generate` for each prompt, the results in prompt order. Every prompt is checked
        first (`share`: a bad one raises before any runs). Without data parallelism (and on
        another group's leader) they run one after another. With it each group runs its
        share: rank 0 runs group 0's here and hands the others to their leaders, one prompt
        at a time; inside `collective_rpc` every group's ranks run their share and every rank
        gets the whole list. A failed prompt's error is raised once every group has finished
        its share (the first failed prompt's, in prompt order); the groups go on serving."""
        self._check_open("generate")
        shares = self.share(prompts, chat=chat, max_new_tokens=max_new_tokens, **options)

        def run(group, i: int) -> GenerationResult:
            return group.generate(prompts[i], max_new_tokens, chat=chat, **options)

        if len(shares) == 1 or not (self._calls.in_step or self._dp.remotes):
            return [run(self, i) for i in range(len(prompts))]  # (a group's own list)
        if self._calls.in_step:  # every rank of the job runs this
            mine = outcomes(self, shares[self._dp.index], run, self._calls.me)
            done = {i: o for part in self._dp.all_gather(mine) for i, o in part.items()}
        else:
            futures = [r.submit(outcomes, r, shares[r.index], run, r.leader)
                       for r in self._dp.remotes]
            done, theirs = alongside(futures, outcomes, self, shares[0], run, self._calls.me)
            for part in theirs:
                done.update(part)
        for i in range(len(prompts)):
            if done[i][1] is not None:
                raise done[i][1]
        return [done[i][0] for i in range(len(prompts))]

    def check_input(self, ids: list[int]) -> None:
        """Refuse prompt ids the model as built cannot take (`Family.check_prompt`).

        Raises:
            PromptError: naming what (DiffusionGemma: image input, which is not served).
        """
        check_prompt = family(self.config.family).check_prompt
        if check_prompt is not None:
            check_prompt(self.config, ids)

    def check(self, prompt: Prompt, *, chat: bool = False, **options: Any
              ) -> tuple[list[int], DecodingParams]:
        """Validate a request without running it: (prompt token ids, resolved params).

        Raises:
            OptionError, PromptError: as `generate` would, before any device work (also
                `check_input`'s).
        """
        params = self.resolve(DecodingOptions.from_kwargs(options))
        ids = self.encode(prompt, chat)
        self.check_input(ids)
        need = self.decoder.max_positions(len(ids), params)
        if len(ids) >= self.max_model_len:
            raise PromptError(f"prompt of {len(ids)} tokens does not fit the context of "
                              f"{self.max_model_len} tokens")
        if need > self.max_model_len:
            pad = need - len(ids) - params.max_new_tokens
            padding = f" ({pad} of them {self.decoder.padding})" if pad > 0 else ""
            tokens = f"{len(ids)} token{'s' if len(ids) != 1 else ''}"
            raise PromptError(
                f"prompt ({tokens}) + max_new_tokens ({params.max_new_tokens}) needs "
                f"{need} positions{padding}, more than the context of {self.max_model_len}")
        return ids, params

    def max_new_tokens_fit(self, prompt_len: int, **options: Any) -> int:
        """The most new tokens a request with a prompt of `prompt_len` tokens and these options
        (their max_new_tokens aside) may ask for within the context, by `check`'s measure
        (decoder padding included); 0 when not even one fits.

        Raises:
            OptionError: a bad option (as `check`).
        """
        opts = DecodingOptions.from_kwargs(options)

        def fits(n: int) -> bool:
            params = self.resolve(dataclasses.replace(opts, max_new_tokens=n))
            return self.decoder.max_positions(prompt_len, params) <= self.max_model_len

        lo, hi = 0, self.max_model_len - prompt_len  # lo fits (0: trivially), hi is tried
        if hi < 1 or fits(hi):
            return max(hi, 0)
        while hi - lo > 1:  # lo fits, hi does not
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def _stream(self, prompt: Prompt, chat: bool, options: dict[str, Any],
                stats: dict[str, Any], defaults: dict[str, Any] | None = None
                ) -> Iterator[BlockOutput]:
        self._check_open("generate or stream")
        ids, params = self.check(prompt, chat=chat, **{**(defaults or {}), **options})
        warn_ignored(DecodingOptions.from_kwargs(options), params)  # (never the defaults)
        # NOTE: rank 0 sends the checked request (its seed included) to the other ranks.
        ids, params, request = self._calls.start_request(ids, params)
        yield from self._run(ids, params, request, stats)

    def _follow_request(self, ids: list[int], params: DecodingParams) -> None:
        """A rank other than 0: run rank 0's request block for block."""
        _, _, request = self._calls.start_request(ids, params)
        for _ in self._run(ids, params, request, {}):
            pass

    def _run(self, ids: list[int], params: DecodingParams, request: Request,
             stats: dict[str, Any]) -> Iterator[BlockOutput]:
        """The request's blocks; after each one, every rank's status (`request.end_block`):
        rank 0 goes on while its consumer asks for more and nothing ended the request."""
        stats["prompt"] = ids
        # NOTE: one request runs at a time: starting one supersedes any stream still open.
        self._request += 1
        me = self._request
        blocks = None
        try:
            text = TextStream(self.tokenizer)
            out: list[int] = []
            rounds = forwards = 0
            t0 = time.perf_counter()
            first_block_s = None
            blocks = self.decoder.decode(ids, params)
            for index in itertools.count():
                block = next(blocks, None)
                if block is None:
                    request.end_block(False)
                    return
                rounds += block.rounds
                forwards += block.rounds + block.extra_forwards
                new, finish, why = trim(block.token_ids, params,
                                        params.max_new_tokens - len(out))
                before = len(text)
                text.extend(new)
                limit = None
                if params.stop_strings:
                    hit = find_stop_string(text, params.stop_strings, before, len(out))
                    if hit is not None:
                        keep, why, limit = hit
                        new, finish = new[: keep - len(out)], "stop"
                out += new
                if finish is None and params.stop_strings:
                    # NOTE: hold back a tail that may be the start of a stop string ending later.
                    limit = stop_holdback(text, params.stop_strings)
                delta = text.emit(final=finish is not None, limit=limit)
                first_block_s = first_block_s or time.perf_counter() - t0
                if finish is not None:
                    total = time.perf_counter() - t0
                    stats.update(total_s=total, timings=dict(
                        first_block_s=first_block_s, total_s=total,
                        forwards=forwards, rounds=rounds,
                        tpf=len(out) / max(rounds, 1)))
                try:
                    yield BlockOutput(index, new, delta, block.rounds,
                                      block.commit_rounds[: len(new)], finish, why,
                                      block.logprobs and block.logprobs[: len(new)])
                except GeneratorExit:  # the consumer closed the stream: every rank stops
                    request.end_block(False)
                    raise
                if finish is not None:  # (a request started after the last block is no newer one)
                    request.end_block(False)
                    return
                if self._request != me:
                    raise DlrtError("this stream was superseded by a newer request on the same "
                                    "LLM (one request runs at a time); finish or close a stream "
                                    "first")
                if not request.end_block(True):
                    return
        except Exception as e:
            request.fail(e)  # every rank hears of it (nothing if the request has ended)
            raise
        finally:
            if blocks is not None:
                blocks.close()
