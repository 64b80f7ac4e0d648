"""`EngineConfig`: every engine option of `LLM(...)` and of the CLI's engine flags, in one frozen
dataclass. Each option's default, choices and help are written once, in its field; the CLI
generates its flags from them (`dlrt.entrypoints.cli`).

Two steps, both methods here (their value rules in `dlrt.engine.resolve`):
`EngineConfig.from_kwargs` checks names, types and choices before anything is read (a bad value
never waits for a checkpoint to load); `resolve` replaces every "auto" and every default by a
concrete value for one checkpoint folder and device and checks what depends on them (the decoder
fits the family, the attention backend serves the device, dtype, head size and KV cache dtype,
the context fits the model, the quantisation scheme fits the folder, the mask token is no end-
of-text id), and returns a `ResolvedConfig`: the resolved options with the model config, the
decoder's defaults, the block length of a default request, the eos ids and the quantisation
scheme. Resolving builds nothing; the engine builds every part from the `ResolvedConfig`, and a
request's defaults come from it. Everything is frozen; nothing changes it afterwards.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlrt import env
from dlrt.attention.kv_cache import KV_FP8
from dlrt.attention.registry import backend_names, check_backend, default_backend
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.quant import QuantScheme, quantizations, resolve_scheme
from dlrt.decoding.options import DEFAULT_MAX_NEW_TOKENS, DecoderDefaults
from dlrt.distributed.ranks import local_ranks, world_size
from dlrt.engine.cpu_threads import resolve_cpu_threads
from dlrt.engine.resolve import (
    check_persistent,
    context_limit,
    eos_ids,
    linear_kernels,
    mask_token,
    tensor_parallel_size,
    torch_device,
)
from dlrt.errors import ConfigError, OptionError
from dlrt.layers.quant.fp8 import ACTIVATIONS
from dlrt.models.config import ModelConfig
from dlrt.models.registry import family, model_config
from dlrt.ops import NAMES as KERNELS
from dlrt.runtime.decoders import DECODERS, decoder_for
from dlrt.runtime.executor import MODES, resolve_mode
from dlrt.tuning.linear import POLICIES as LINEAR_KERNELS

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float64": torch.float64}
LOAD_FORMATS = ("auto", "safetensors", "dummy")
KV_CACHE_DTYPES = ("auto", "fp8")


def _option(default: Any, help: str, choices: Sequence[str] | None = None,
            flag: str | None = None):
    return field(default=default, metadata=dict(help=help, choices=choices, flag=flag))


class _Choices(Sequence):
    """An option's choices read from a registry each time they are asked for (a format
    registered after this module was imported is among them)."""

    def __init__(self, read: Callable[[], tuple[str, ...]]):
        self._read = read

    def __getitem__(self, i):
        return self._read()[i]

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return repr(self._read())


@dataclass(frozen=True)
class EngineConfig:
    """The engine options of one `LLM` (before `resolve`: as given, "auto" allowed)."""

    model: str | Path | None = _option(
        None, "checkpoint folder, or a Hugging Face repo id (org/name) fetched with "
        "huggingface_hub (default: the embedded tiny SDAR model)")
    dtype: str = _option(
        "auto", "weights and activations: auto (bfloat16 on CUDA, float32 on the CPU)",
        ("auto", *DTYPES))
    device: str = _option("auto", "auto (CUDA when available), cpu, cuda or cuda:N")
    load_format: str = _option(
        "auto", "auto/safetensors: read the weights; dummy: seeded random weights, no weight "
        "files needed", LOAD_FORMATS)
    seed: int = _option(0, "seed of the dummy weights (--load-format dummy)",
                        flag="--load-seed")
    max_model_len: int | None = _option(
        None, "context limit in tokens (default: the config's maximum)")
    decoder: str = _option(
        "auto", "the block loop; auto: the model family's default (block for SDAR and "
        "LLaDA2, canvas for LLaDA, renoise for DiffusionGemma; dllm_var decodes LLaDA "
        "weights block by block)",
        ("auto", *DECODERS))
    mask_token_id: int | None = _option(
        None, "mask token id (default: the config's, else the tokenizer's; renoising "
        "families such as DiffusionGemma have none)")
    execution_mode: str = _option(
        "auto", "device_loop (one CUDA graph per block, its WHILE node runs the rounds; auto "
        "on CUDA where its kernel can be built: NVRTC from cuda-bindings, else nvcc), "
        "host_loop (a graph per round; auto on CUDA otherwise, with a warning), eager (auto on "
        "the CPU); all give the same tokens", ("auto", *MODES))
    attention_backend: str = _option(
        "auto", "auto (sdpa on the CPU; flashinfer for the canvas decoder on Hopper when "
        "installed; else triton; DLRT_ATTENTION_BACKEND overrides auto), triton, flashinfer "
        "(FA3/FA2, planned on the host once per block), flashinfer-fa2, sdpa (eager only)",
        ("auto", *backend_names()))
    quantization: str = _option(
        "auto", "weights: auto (the checkpoint's quantization config: fp8 block-scaled, "
        "ModelOpt nvfp4 or compressed-tensors FP8; else unquantised), none (an unquantised "
        "checkpoint), a format: fp8 / nvfp4 / compressed-tensors-fp8 (a checkpoint in that "
        "format, or an unquantised one quantised while loading; fp8: 128x128 blocks, "
        "compressed-tensors-fp8: per output channel)", _Choices(quantizations))
    fp8_activations: str = _option(
        "dynamic", "FP8 linear layers: dynamic (W8A8: activations quantised to e4m3 per token "
        "and 128-column group at run time, the checkpoints' activation_scheme 'dynamic' as "
        "vLLM and SGLang run it; about 2x BF16 per projection at a round's rows on an H200), "
        "weight_only (activations stay in the model dtype: the exact product with the "
        "dequantised weight, slower); the same for compressed-tensors FP8, whose checkpoints "
        "without input activations (W8A16) run weight-only. FP8 experts of MoE layers are "
        "weight-only either way",
        ACTIVATIONS)
    kv_cache_dtype: str = _option(
        "auto", "the KV cache: auto (the model dtype), fp8 (float8_e4m3fn: half the bytes of "
        "bfloat16; K and V divided by per-layer fp32 scales, the checkpoint's "
        "self_attn.k_scale / v_scale, else 1.0; attention backends triton (sm_89+) and sdpa)",
        KV_CACHE_DTYPES)
    kernels: str = _option(
        "auto", "the small ops of a forward and a round: auto (triton on CUDA, reference on the "
        "CPU), triton (Triton kernels; on the CPU only under TRITON_INTERPRET=1), reference "
        "(plain PyTorch)", ("auto", *KERNELS))
    round_kernel: str = _option(
        "auto", "the forward of a block's round: layers (a kernel per op; auto), persistent "
        "(csrc/persistent_round.cu: one resident CTA per SM runs the whole round; CUDA, dense "
        "SDAR models with the block decoder, bfloat16 / float32 weights or weight-only fp8 "
        "projections, a KV cache of the model dtype; it does not yet match the layer path's "
        "speed and is chosen only when asked for)",
        ("auto", "layers", "persistent"))
    tensor_parallel_size: int | None = _option(
        None, "ranks the model is cut across (attention heads, MLP widths, experts, "
        "vocabulary), one process each under torchrun; default: torchrun's world size (1 "
        "without torchrun); 1 under torchrun: every rank holds the whole model")
    data_parallel_size: int = _option(
        1, "whole engines side by side under torchrun (data_parallel_size x "
        "tensor_parallel_size ranks; each group of consecutive ranks loads the model): rank 0 "
        "shares a list of prompts among them (LLM.generate, bench humaneval / quality) and "
        "dlrt serve hands each request to an idle one")
    linear_kernels: str = _option(
        "auto", "projections on CUDA with Triton kernels: auto (per weight shape, cuBLAS or the "
        "skinny Triton GEMM, whichever was timed faster at load), cublas, triton (the fastest "
        "Triton config for every shape)", LINEAR_KERNELS)
    cpu_threads: str | int = _option(
        "auto", "torch threads for a model on the CPU (torch.set_num_threads, for the whole "
        "process): auto (1 for a small model such as the embedded default; else the idle "
        "cores this process may use; torch's count when OMP_NUM_THREADS is set or under "
        "several ranks), or a count; a model on CUDA leaves torch's count as it is")

    # -- the first step: names, types, choices ------------------------------------------------
    @staticmethod
    def from_kwargs(**kwargs: Any) -> EngineConfig:
        """Build from keyword options; None means the default.

        Raises:
            OptionError: an unknown option, a value of the wrong type, or a value not among
                the option's choices (the message names the option).
        """
        fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            raise OptionError(f"unknown engine option(s) {unknown}; known: {sorted(fields)}")
        given = {k: v for k, v in kwargs.items() if v is not None}
        for name, value in given.items():
            _check_value(fields[name], value)
        return EngineConfig(**given)

    # -- the second step: concrete values for one checkpoint ----------------------------------
    @property
    def torch_device(self) -> torch.device:
        return torch_device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_kv_cache_dtype(self) -> torch.dtype:
        """What the KV cache stores (after `resolve_device`): the model dtype or FP8."""
        return KV_FP8 if self.kv_cache_dtype == "fp8" else DTYPES[self.kv_cache_dtype]

    def resolve_device(self) -> EngineConfig:
        """Device, dtype, execution mode, kernels, KV cache dtype and (when asked for) the
        attention backend: what needs no checkpoint, checked before one is opened.

        Raises:
            OptionError: a device that does not exist here, a mode or backend it cannot run,
                Triton kernels without Triton, an attention backend that does not read the
                KV cache's dtype (FlashInfer and an FP8 cache), the persistent round off CUDA
                or under tensor parallelism (each part's own reason: `supports`).
        """
        tp = tensor_parallel_size(self.tensor_parallel_size, self.device,
                                  self.data_parallel_size)
        device = torch_device(self.device)
        if world_size() > 1 and device.type == "cuda" and device.index is None:
            # this rank's GPU (tensor_parallel_size 1: whole models, as many as fit)
            device = torch.device("cuda", local_ranks()[0] % max(torch.cuda.device_count(), 1))
        dtype = self.dtype if self.dtype != "auto" else (
            "bfloat16" if device.type == "cuda" else "float32")
        mode = resolve_mode(self.execution_mode, device)
        kernels = self.kernels if self.kernels != "auto" else (
            "triton" if device.type == "cuda" else "reference")
        if kernels == "triton" and device.type != "cuda" \
                and os.environ.get("TRITON_INTERPRET") != "1":
            raise OptionError("kernels 'triton' need a CUDA device (on the CPU they run only in "
                              "Triton's interpreter, TRITON_INTERPRET=1); use 'reference'")
        kv = self.kv_cache_dtype if self.kv_cache_dtype != "auto" else dtype
        kv_torch = KV_FP8 if kv == "fp8" else None
        attention = self.attention_backend
        if attention == "auto" and env.attention_backend():
            attention = env.attention_backend()
            try:
                check_backend(attention, device, DTYPES[dtype], mode, kv_cache_dtype=kv_torch)
            except OptionError as e:
                raise OptionError(f"{e} (DLRT_ATTENTION_BACKEND={attention})") from e
        elif attention != "auto":
            check_backend(attention, device, DTYPES[dtype], mode, kv_cache_dtype=kv_torch)
        round_kernel = "layers" if self.round_kernel == "auto" else self.round_kernel
        if round_kernel == "persistent":
            check_persistent(device=device, tensor_parallel_size=tp)
        return dataclasses.replace(self, device=str(device), dtype=dtype, execution_mode=mode,
                                   kernels=kernels, attention_backend=attention,
                                   kv_cache_dtype=kv, round_kernel=round_kernel,
                                   tensor_parallel_size=tp)

    def resolve(self, folder: CheckpointFolder, tokenizer_mask_id: int | None = None
                ) -> ResolvedConfig:
        """Every "auto" and every default made concrete for the checkpoint `folder` (its
        tokenizer's mask token `tokenizer_mask_id`, if any). Reads the folder's JSON files:
        no weights, no model, no device memory; with `cpu_threads="auto"` for a large model on
        the CPU it also watches the cores' load in /proc/stat for 0.1 s
        (`dlrt.engine.cpu_threads.resolve_cpu_threads`).

        Raises:
            OptionError: as `resolve_device`; a decoder that does not fit the family, an
                attention backend that cannot serve the model, a persistent round that does
                not serve the model, decoder or precision, max_model_len or
                mask_token_id out of range, a mask token that is an end-of-text id, a
                quantization the folder does not hold ("none" for a quantised folder, another
                format).
            ConfigError: a config.json dlrt cannot read, or no mask token anywhere (config,
                tokenizer, option); the message starts with the folder.
            CheckpointError: a generation_config.json or quantization config dlrt cannot
                read.
        """
        out = self.resolve_device()
        device, dtype = out.torch_device, out.torch_dtype
        config = read_model_config(folder)
        try:
            decoder, defaults = decoder_for(family(config.family),
                                            None if out.decoder == "auto" else out.decoder,
                                            config.block_size)
            mask = mask_token(config, out.mask_token_id, tokenizer_mask_id, defaults.renoise)
        except ConfigError as e:
            raise ConfigError(f"{folder.path}: {e}") from e
        kv = out.torch_kv_cache_dtype
        attention = out.attention_backend
        needs = config.attention_needs()
        if attention == "auto":
            attention = default_backend(device, dtype, decoder, config.head_dim, kv, needs)
        check_backend(attention, device, dtype, out.execution_mode, config.head_dim, kv, needs)
        max_len = context_limit(config, out.max_model_len)
        config = config.replace(mask_token_id=mask)
        folder.check_generation_config(config.vocab_size)
        eos = eos_ids(folder.generation_config, config)
        if mask in eos:
            raise OptionError(
                f"mask_token_id={mask} is an end-of-text id of {folder.path} (eos ids "
                f"{list(eos)}): the mask token is never committed, so a generation could not "
                "stop; pass another mask_token_id")
        scheme = resolve_scheme(out.quantization, folder.hf_config, folder.path)
        if out.round_kernel == "persistent":
            check_persistent(device=device, tensor_parallel_size=out.tensor_parallel_size,
                              config=config, decoder=decoder, dtype=dtype, kv_cache_dtype=kv,
                              quantization=scheme.name if scheme else "none",
                              fp8_activations=out.fp8_activations)
        load = "safetensors" if out.load_format == "auto" else out.load_format
        policy = linear_kernels(out.linear_kernels, out.kernels, device)
        out = dataclasses.replace(out, model=str(folder.path), decoder=decoder,
                                  attention_backend=attention, max_model_len=max_len,
                                  mask_token_id=mask, load_format=load,
                                  quantization=scheme.name if scheme else "none",
                                  linear_kernels=policy,
                                  cpu_threads=resolve_cpu_threads(
                                      out.cpu_threads, device, config,
                                      out.tensor_parallel_size * out.data_parallel_size))
        return ResolvedConfig(out, config, defaults,
                              defaults.block_length or DEFAULT_MAX_NEW_TOKENS, eos, scheme)


def read_model_config(folder: CheckpointFolder) -> ModelConfig:
    """dlrt's reading of the folder's `config.json` (`dlrt.models.registry.model_config`).

    Raises:
        ConfigError: a field dlrt cannot read, named; the message starts with the folder.
    """
    try:
        return model_config(folder.hf_config)
    except ConfigError as e:
        raise ConfigError(f"{folder.path}: {e}") from e


@dataclass(frozen=True)
class ResolvedConfig:
    """An `EngineConfig` resolved for one checkpoint folder and device (`EngineConfig.resolve`):
    the one source the engine builds its parts from and a request's defaults come from.

    engine: the options, no "auto" left (quantization: the format loaded, or "none").
    model: the checkpoint's `ModelConfig`, with the mask token used.
    decoder_defaults: the decoder's defaults for a request (block_length None: the canvas
        decoder's one block over the whole generation, as long as the request's
        max_new_tokens).
    block_length: the block length of a request that sets neither block_length nor
        max_new_tokens (the canvas decoder: `DEFAULT_MAX_NEW_TOKENS`); the linear plan times
        the projections at its rows (at most 16), the persistent round is built for it, and
        the benchmarks use it when no block length is given.
    eos_token_ids: generation_config.json's eos ids (else config.json's) and the family's stop
        ids; a request stops at them unless it sets ignore_eos.
    quant: the quantisation scheme of the load (None: unquantised weights).
    """

    engine: EngineConfig
    model: ModelConfig
    decoder_defaults: DecoderDefaults
    block_length: int
    eos_token_ids: tuple[int, ...]
    quant: QuantScheme | None = None


def _check_value(f: dataclasses.Field, value: Any) -> None:
    name, choices = f.name, f.metadata["choices"]
    if name in ("model",):
        return  # a path: checked when the checkpoint is opened
    if name == "cpu_threads":
        _check_cpu_threads(value)
        return
    want = int if name in ("seed", "max_model_len", "mask_token_id", "tensor_parallel_size",
                           "data_parallel_size") else str
    if isinstance(value, bool) or not isinstance(value, want):
        raise OptionError(f"{name} must be {'an integer' if want is int else 'a string'}, "
                          f"got {value!r}")
    if name == "seed" and not 0 <= value < 2**63:
        raise OptionError(f"seed={value!r} must be in [0, 2^63)")
    if name in ("tensor_parallel_size", "data_parallel_size") and value < 1:
        raise OptionError(f"{name}={value!r} must be at least 1")
    if choices is not None and value not in choices:
        raise OptionError(f"{name} {value!r}: unknown {name.replace('_', ' ')}; one of "
                          f"{list(choices)}")


def _check_cpu_threads(value: Any) -> None:
    """"auto", or a count >= 1 (an int, or its digits as the command line gives it)."""
    count = value if isinstance(value, int) and not isinstance(value, bool) else (
        int(value) if isinstance(value, str) and value.isdigit() else None)
    if value != "auto" and (count is None or count < 1):
        raise OptionError(f"cpu_threads must be 'auto' or a count >= 1, got {value!r}")


# option -> its command-line flag, where the flag is not `--` + the name with dashes
ENGINE_FLAGS = {f.name: f.metadata["flag"] for f in dataclasses.fields(EngineConfig)
                if f.metadata["flag"]}
