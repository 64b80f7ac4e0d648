"""`LLM`: load a block-diffusion checkpoint and generate from Python."""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dlrt import env
from dlrt.attention import get_backend
from dlrt.attention.backend import capturable, check_device, check_model, default_backend
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.loader import init_dummy, load_safetensors, materialize
from dlrt.config import ModelConfig
from dlrt.decoding.options import DecodingOptions, DecodingParams, resolve
from dlrt.errors import ConfigError, DlrtError, OptionError, PromptError
from dlrt.models import build_model
from dlrt.outputs import BlockOutput, GenerationResult
from dlrt.runtime.decoders import DECODERS, FAMILY_STOP_IDS, decoder_for
from dlrt.runtime.executor import Executor, check_mode
from dlrt.runtime.kv_cache import PagedKVCache
from dlrt.runtime.runner import ModelRunner
from dlrt.tokenizer import Prompt, TextStream, encode_prompt, load_tokenizer

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float64": torch.float64}
LOAD_FORMATS = ("auto", "safetensors", "dummy")
DEFAULT_MAX_NEW_TOKENS = 128


class LLM:
    """A loaded model ready to generate, one request at a time.

    Args:
        model: checkpoint folder (Hugging Face layout, safetensors only); None = the embedded
            default (a tiny SDAR model with the SDAR tokenizer, made on first use).
        dtype: "auto" (bfloat16 on CUDA, float32 on CPU) or a dtype name.
        device: "auto" (CUDA when available), "cpu", "cuda", "cuda:N".
        load_format: "auto"/"safetensors" (read the weights) or "dummy" (seeded random weights,
            no weight files needed: benchmarks on configs alone).
        decoder: "block" (SDAR), "canvas" (LLaDA pure diffusion / semi-AR) or "dllm_var"
            (LLaDA weights, block decoding with KV cache and look-ahead); None = family default.
        mask_token_id: overrides the config's / tokenizer's mask token.
        max_model_len: context limit in tokens (default: the config's maximum).
        attention_backend: "triton" (paged kernel), "flashinfer" (FlashInfer's FA3/FA2 kernels,
            planned on the host once per block; bf16/fp16 on sm_80+), "flashinfer-fa2" (FA2
            only) or "sdpa" (reference, eager only). Default: `default_backend` (sdpa on CPU;
            flashinfer for the canvas decoder on Hopper when installed; else triton).
        execution_mode: "device_loop" (one CUDA graph per block whose WHILE node runs the
            rounds; default on CUDA), "host_loop" (a graph per round, one sync per round) or
            "eager" (the only mode on CPU). All three give the same tokens.
        seed: seed of dummy weights.
    Raises:
        CheckpointError, ConfigError, OptionError: the message names the problem.
    """

    def __init__(self, model: str | Path | None = None, *, dtype: str = "auto",
                 device: str = "auto", load_format: str = "auto", decoder: str | None = None,
                 mask_token_id: int | None = None, max_model_len: int | None = None,
                 attention_backend: str | None = None, execution_mode: str | None = None,
                 seed: int = 0):
        # Engine options first: a bad value fails before any weight is read.
        if load_format not in LOAD_FORMATS:
            raise OptionError(f"load_format {load_format!r} is not one of {LOAD_FORMATS}")
        self.device = _device(device)
        self.dtype = _dtype(dtype, self.device)
        cuda = self.device.type == "cuda"
        self.execution_mode = execution_mode or ("device_loop" if cuda else "eager")
        self.executor = Executor(self.execution_mode, self.device)
        asked = attention_backend or env.attention_backend()
        if asked is not None:  # a bad backend fails before the checkpoint is opened
            try:
                _check_backend(self.execution_mode, asked, self.device, self.dtype)
            except OptionError as e:
                if attention_backend is None:  # name where the choice came from
                    raise OptionError(f"{e} (DLRT_ATTENTION_BACKEND={asked})") from e
                raise
        if model is None:
            from dlrt.checkpoint.presets import default_model_path

            model = default_model_path()
        self.folder = CheckpointFolder.open(model, require_weights=load_format != "dummy")
        config = ModelConfig.from_hf(self.folder.hf_config)
        self.max_model_len = _context(config, max_model_len)
        self.decoder_name, self.decoder_defaults = decoder_for(
            config.family, decoder, config.block_size)
        self.attention_backend = asked or default_backend(
            self.device, self.dtype, self.decoder_name, config.head_dim)
        check_model(self.attention_backend, config.head_dim)
        if asked is None:
            # NOTE: check before get_backend imports the kernels (Triton reads
            # TRITON_INTERPRET when a kernel is defined).
            _check_backend(self.execution_mode, self.attention_backend, self.device, self.dtype)
        backend = get_backend(self.attention_backend)
        self.tokenizer = load_tokenizer(self.folder.path)
        self.config = config.replace(mask_token_id=self._mask_token(config, mask_token_id))
        gen_eos = self.folder.generation_config.get("eos_token_id")
        eos = tuple(gen_eos if isinstance(gen_eos, list) else [gen_eos]) if gen_eos is not None \
            else config.eos_token_ids
        self.eos_token_ids = tuple(dict.fromkeys(eos + FAMILY_STOP_IDS.get(config.family, ())))
        self.model = self._load(load_format, seed)
        self.gemm_choices = self._tune_projections()
        self._request = 0  # id of the request allowed to run
        cache = PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim,
                             self.max_model_len, self.dtype, self.device)
        self.runner = ModelRunner(self.model, backend, cache, self.device)
        module, cls, _ = DECODERS[self.decoder_name]
        self.decoder = getattr(importlib.import_module(module), cls)(
            self.runner, self.config.mask_token_id, self.decoder_defaults, self.executor)

    def _tune_projections(self) -> dict[str, dict]:
        """On CUDA: per projection shape, cuBLAS or the skinny Triton GEMM, whichever is
        faster at the block's rows (timed once per device, then cached). {} elsewhere."""
        if self.device.type != "cuda" or not env.fused_kernels() \
                or env.skinny_gemm() == "0":
            return {}
        from dlrt.kernels.gemm_select import tune

        rows = self.decoder_defaults.block_length or 4
        return tune(self.model, rows=min(rows, 16), force=env.skinny_gemm() == "all")

    def _mask_token(self, config: ModelConfig, option: int | None) -> int:
        if option is not None:
            if isinstance(option, bool) or not isinstance(option, int) \
                    or not 0 <= option < config.vocab_size:
                raise OptionError(f"mask_token_id={option!r} is not a token id of the vocabulary")
            return option
        if config.mask_token_id is not None:
            return int(config.mask_token_id)
        tok_mask = getattr(self.tokenizer, "mask_token_id", None)
        if tok_mask is not None:
            return int(tok_mask)
        raise ConfigError(f"{self.folder.path}: config.json has no mask_token_id and the "
                          "tokenizer no mask token; pass mask_token_id=...")

    def _load(self, load_format: str, seed: int) -> torch.nn.Module:
        with torch.device("meta"):
            model = build_model(self.config)
        materialize(model, self.dtype, self.device)
        if load_format == "dummy":
            init_dummy(model, seed, self.config.initializer_range)
        else:
            load_safetensors(model, self.folder)
        return model.eval()

    def set_execution_mode(self, mode: str) -> None:
        """Switch between "device_loop", "host_loop" and "eager" (benchmarks compare them on
        one loaded model). Captured graphs are kept per mode."""
        _check_backend(check_mode(mode, self.device), self.attention_backend)
        self.executor.mode = self.execution_mode = mode

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids of a prompt (see `dlrt.tokenizer.encode_prompt`)."""
        return encode_prompt(self.tokenizer, prompt, self.config.vocab_size, chat)

    def resolve(self, options: DecodingOptions) -> DecodingParams:
        """Resolve per-request options against this model's defaults.

        Raises:
            OptionError: a bad option; a stop id outside the vocabulary; a stop string for a
                checkpoint without a tokenizer (it could never match).
        """
        vocab = self.config.vocab_size
        for s in options.stop:
            if isinstance(s, int) and not 0 <= s < vocab:
                raise OptionError(f"stop token id {s} is not in the vocabulary [0, {vocab})")
            if isinstance(s, str) and self.tokenizer is None:
                raise OptionError(f"stop string {s!r} needs a tokenizer and {self.folder.path} "
                                  "has none; give stop token ids")
        return resolve(options, self.decoder_defaults, self.folder.generation_config,
                       self.eos_token_ids, DEFAULT_MAX_NEW_TOKENS, random.randrange(2**31))

    def stream(self, prompt: Prompt, *, chat: bool = False, **options: Any
               ) -> Iterator[BlockOutput]:
        """Generate, yielding one `BlockOutput` per decided block. Options as `generate`."""
        yield from self._stream(prompt, chat, options, {})

    def generate(self, prompt: Prompt, max_new_tokens: int | None = None, *, chat: bool = False,
                 **options: Any) -> GenerationResult:
        """Generate for one prompt.

        Args:
            prompt: text, a list of chat messages ({"role", "content"}; through the chat
                template), or a list of token ids. Text goes through the chat template too
                when `chat=True`.
            max_new_tokens and **options: see `dlrt.decoding.options.DecodingOptions`
                (block_length, denoising_steps, remasking_strategy, threshold, eb_threshold,
                temperature, top_k, top_p, seed, stop, ignore_eos).
        Raises:
            OptionError: unknown option or bad value. PromptError: bad or too long prompt.
        """
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
            request_tps=len(tokens) / max(stats["total_s"], 1e-9), timings=stats["timings"])

    def check(self, prompt: Prompt, *, chat: bool = False, **options: Any
              ) -> tuple[list[int], DecodingParams]:
        """Validate a request without running it: (prompt token ids, resolved params).

        Raises:
            OptionError, PromptError: as `generate` would, before any device work.
        """
        params = self.resolve(DecodingOptions.from_kwargs(options))
        ids = self.encode(prompt, chat)
        need = self.decoder.max_positions(len(ids), params)
        if len(ids) >= self.max_model_len:
            raise PromptError(f"prompt of {len(ids)} tokens does not fit the context of "
                              f"{self.max_model_len} tokens")
        if need > self.max_model_len:
            raise PromptError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) needs "
                f"{need} positions, more than the context of {self.max_model_len}")
        return ids, params

    def _stream(self, prompt: Prompt, chat: bool, options: dict[str, Any],
                stats: dict[str, Any]) -> Iterator[BlockOutput]:
        ids, params = self.check(prompt, chat=chat, **options)
        stats["prompt"] = ids
        # NOTE: one request runs at a time: starting one supersedes any stream still open.
        self._request += 1
        me = self._request
        text = TextStream(self.tokenizer)
        out: list[int] = []
        rounds = forwards = 0
        t0 = time.perf_counter()
        first_block_s = None
        blocks = self.decoder.decode(ids, params)
        for index in itertools.count():
            if self._request != me:
                raise DlrtError("this stream was superseded by a newer request on the same LLM "
                                "(one request runs at a time); finish or close a stream first")
            block = next(blocks, None)
            if block is None:
                return
            rounds += block.rounds
            forwards += block.rounds + block.extra_forwards
            new, finish, why = _trim(block.token_ids, params, params.max_new_tokens - len(out))
            before = len(text)
            text.extend(new)
            limit = None
            if params.stop_strings:
                hit = _find_stop_string(text, params.stop_strings, before, len(out))
                if hit is not None:
                    keep, why, limit = hit
                    new, finish = new[: keep - len(out)], "stop"
            out += new
            if finish is None and params.stop_strings:
                # NOTE: hold back a tail that may be the start of a stop string ending later.
                limit = _stop_holdback(text, params.stop_strings)
            delta = text.emit(final=finish is not None, limit=limit)
            first_block_s = first_block_s or time.perf_counter() - t0
            if finish is not None:
                total = time.perf_counter() - t0
                stats.update(total_s=total, timings=dict(
                    first_block_s=first_block_s, total_s=total,
                    forwards=forwards, rounds=rounds,
                    tpf=len(out) / max(rounds, 1)))
            yield BlockOutput(index, new, delta, block.rounds,
                              block.commit_rounds[: len(new)], finish, why)
            if finish is not None:
                return


def _trim(tokens: list[int], params: DecodingParams, room: int):
    """Cut a block's tokens before the first stop id and at the `max_new_tokens` room left."""
    for i, t in enumerate(tokens[:room]):
        if t in params.stop_token_ids:
            return tokens[:i], "stop", t
    if len(tokens) >= room:
        return tokens[:room], "length", None
    return tokens, None, None


def _find_stop_string(text: TextStream, stops: tuple[str, ...], before: int, done: int):
    """If a stop string ends in the text added since character `before`, return (tokens to
    keep: up to the one that completes the earliest stop string, the stop string, its character
    offset). Only the tail is searched, so the cost does not grow with the output."""
    start = max(0, before - max(len(s) for s in stops) + 1)
    tail = text.window(start)
    hits = [(tail.find(s), s) for s in stops if s in tail]
    if not hits:
        return None
    pos, stop = min(hits)
    keep = max(done, 1)
    while stop not in text.decode(text.ids[:keep]):
        keep += 1
    return keep, stop, start + pos


def _stop_holdback(text: TextStream, stops: tuple[str, ...]) -> int:
    """Character offset up to which the text may be emitted: before the longest tail of it
    that is a proper prefix of a stop string."""
    longest = max(len(s) for s in stops)
    tail = text.window(max(0, len(text) - longest))
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(tail)), hold, -1):
            if tail.endswith(stop[:n]):
                hold = n
                break
    return len(text) - hold


def _check_backend(mode: str, backend: str, device: torch.device | None = None,
                   dtype: torch.dtype | None = None) -> None:
    if device is not None and dtype is not None:
        check_device(backend, device, dtype)
    if backend == "triton" and device is not None and device.type != "cuda" \
            and os.environ.get("TRITON_INTERPRET") != "1":
        raise OptionError("attention backend 'triton' needs a CUDA device (on the CPU it runs "
                          "only in Triton's interpreter, TRITON_INTERPRET=1); use 'sdpa'")
    if mode != "eager" and not capturable(backend):
        raise OptionError(f"execution_mode {mode!r} needs a graph-capturable attention backend "
                          f"(triton, flashinfer), not {backend!r}")


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OptionError(f"device {device!r} is not a valid device") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device {device!r} asked for, but CUDA is not available")
    if dev.type not in ("cpu", "cuda"):
        raise OptionError(f"device {device!r}: only cpu and cuda are supported")
    return dev


def _dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise OptionError(f"dtype {dtype!r} is not one of {['auto', *DTYPES]}")
    return DTYPES[dtype]


def _context(config: ModelConfig, max_model_len: int | None) -> int:
    limit = config.max_position_embeddings
    if max_model_len is None:
        return limit
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) \
            or not 1 <= max_model_len <= limit:
        raise OptionError(f"max_model_len={max_model_len!r} must be in [1, {limit}]")
    return max_model_len
