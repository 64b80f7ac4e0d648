"""The engine: one checkpoint loaded for one `EngineConfig`, with everything a request runs on.

`Engine.create` opens the checkpoint folder and its tokenizer, resolves the config
(`EngineConfig.resolve`: nothing built, JSON files read, and for cpu_threads="auto" with a
large model on the CPU the cores' load watched for 0.1 s; `Engine.open` stops there) and builds
from the `ResolvedConfig`, in order: the ops table, the model (meta device, then weights), the
linear layers' methods (`dlrt.tuning.linear`, `dlrt.tuning.quant`), the paged KV cache (the
model dtype, or FP8 with the checkpoint's per-layer scales), the attention backend, the runner,
the executor and the decoder. Nothing here is global but the CPU thread count: for a model on
the CPU, `apply_cpu_threads` sets the whole process's torch thread count
(`torch.set_num_threads`); otherwise two engines in one process are independent. Under torchrun
the engine owns the ranks: its tensor-parallel group (`tp`) and its data-parallel groups (`dp`:
this rank's group, the links between rank 0 and the other groups' leaders).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlrt.attention.kv_cache import KV_FP8, PagedKVCache
from dlrt.attention.registry import get_backend
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.kv_scales import read_kv_scales
from dlrt.checkpoint.loader import init_dummy, load_safetensors, materialize
from dlrt.checkpoint.quant import QuantScheme, quantize_model
from dlrt.decoding.options import DecoderDefaults
from dlrt.distributed.agree import check_all_loaded, check_ranks_agree
from dlrt.distributed.data_parallel import DataParallel, data_parallel
from dlrt.distributed.group import TensorParallel, tensor_parallel_group
from dlrt.distributed.ranks import Ranks
from dlrt.distributed.transform import check_sizes, shard_model
from dlrt.distributed.vocab import VocabShard
from dlrt.engine.config import EngineConfig, ResolvedConfig, read_model_config
from dlrt.engine.cpu_threads import apply_cpu_threads
from dlrt.engine.lifecycle import Lifecycle
from dlrt.engine.sleep import Sleep
from dlrt.errors import OptionError
from dlrt.models.config import ModelConfig
from dlrt.models.registry import build_model, family
from dlrt.ops import Ops, get_ops
from dlrt.runtime.decoders import build_decoder
from dlrt.runtime.executor import Executor
from dlrt.runtime.runner import ModelRunner
from dlrt.tokenizer import load_tokenizer
from dlrt.tuning.linear import LinearPlan, tune
from dlrt.tuning.quant import tune_quant

log = logging.getLogger(__name__)


@dataclass
class Engine(Lifecycle):
    """What `LLM` runs on; every part built from `resolved` (no "auto" left). Sleep, wake and
    weight updates: `Lifecycle`."""

    resolved: ResolvedConfig
    folder: CheckpointFolder
    tokenizer: Any
    ops: Ops
    model: nn.Module
    linear_plan: LinearPlan
    runner: ModelRunner
    executor: Executor
    decoder: Any
    tp: TensorParallel = dataclasses.field(default_factory=lambda: TensorParallel(0, 1))
    dp: DataParallel = dataclasses.field(default_factory=DataParallel)
    sleeping: Sleep | None = None  # (`sleep`; None: awake)

    @property
    def config(self) -> EngineConfig:
        """The resolved engine options."""
        return self.resolved.engine

    @property
    def model_config(self) -> ModelConfig:
        """The checkpoint's `ModelConfig`, with the mask token used."""
        return self.resolved.model

    @property
    def decoder_defaults(self) -> DecoderDefaults:
        return self.resolved.decoder_defaults

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.resolved.eos_token_ids

    @staticmethod
    def open(options: EngineConfig) -> tuple[ResolvedConfig, CheckpointFolder, Any]:
        """Open the checkpoint folder (`options.model`; None: the embedded default) and its
        tokenizer, and resolve the options for them: (resolved config, folder, tokenizer or
        None). Reads the folder's JSON and tokenizer files (and watches the cores' load as
        `EngineConfig.resolve` says); builds nothing.

        Raises:
            CheckpointError, ConfigError, OptionError: as `EngineConfig.resolve`; option
                errors that need no checkpoint come before it is opened.
        """
        options = options.resolve_device()
        path = options.model
        if path is None:
            from dlrt.checkpoint.default import default_model_path

            path = default_model_path()
        folder = CheckpointFolder.open(path, require_weights=options.load_format != "dummy")
        # NOTE: config.json first: transformers' AutoTokenizer validates it too (for a
        # model_type it knows), and its error would blame the tokenizer
        read_model_config(folder)
        tokenizer = load_tokenizer(folder.path)
        resolved = options.resolve(folder, getattr(tokenizer, "mask_token_id", None))
        return resolved, folder, tokenizer

    @staticmethod
    def create(options: EngineConfig) -> Engine:
        """Load the checkpoint and build the engine (`open`, then every part from the resolved
        config). With tensor or data parallelism every rank goes on or every rank raises: once
        the ranks agree (`_parallel`), each one's outcome of the load is exchanged at its end
        over the load-time channel (`check_all_loaded`).

        Raises:
            CheckpointError, ConfigError, OptionError: the message names the problem; option
                errors that need no checkpoint come before it is opened.
            RankError: another rank failed to load (named, with its error); this rank raises
                its own error.
        """
        resolved, folder, tokenizer = Engine.open(options)
        config, mconfig, scheme = resolved.engine, resolved.model, resolved.quant
        device = config.torch_device
        apply_cpu_threads(device, config.cpu_threads)
        tp, dp = _parallel(config, mconfig, folder, scheme)
        _report_quantization(scheme, device)
        if tp.control is None:
            return _build(resolved, folder, tokenizer, tp, dp)
        try:
            engine, error = _build(resolved, folder, tokenizer, tp, dp), None
        except Exception as e:  # the other ranks hear of it before it is raised
            engine, error = None, e
        check_all_loaded(tp.control, error)  # all loaded: the first sums start together
        return engine


def _build(resolved: ResolvedConfig, folder: CheckpointFolder, tokenizer: Any,
           tp: TensorParallel, dp: DataParallel) -> Engine:
    """Every part of the engine from the resolved config, for this rank's share (`tp`)."""
    config, mconfig, scheme = resolved.engine, resolved.model, resolved.quant
    device = config.torch_device
    ops = get_ops(config.kernels)
    model = _load(mconfig, ops, folder, config, scheme, tp)
    plan = _plan_linears(model, config, resolved.block_length)
    plan.apply(model)
    cache = _kv_cache(mconfig, config, model, folder, tp.size)
    backend = get_backend(config.attention_backend, cache, mconfig.num_heads // tp.size)
    vocab = VocabShard(tp, mconfig.vocab_size) if tp.size > 1 else None
    persistent = _persistent_rounds(model, cache, resolved.block_length) \
        if config.round_kernel == "persistent" else None
    runner = ModelRunner(model, ops, backend, cache, device, vocab=vocab,
                         persistent=persistent)
    executor = Executor(config.execution_mode, device, backend)
    decoder = build_decoder(config.decoder, runner, mconfig.mask_token_id,
                            resolved.decoder_defaults, executor)
    if tp.size > 1 and device.type == "cuda":
        torch.cuda.synchronize(device)  # its device work done before the ranks go on
    return Engine(resolved, folder, tokenizer, ops, model, plan, runner, executor, decoder, tp,
                  dp)


def _parallel(config: EngineConfig, mconfig: ModelConfig, folder: CheckpointFolder,
              scheme: QuantScheme | None) -> tuple[TensorParallel, DataParallel]:
    """This rank's tensor-parallel group (size 1 without tensor parallelism) and data-parallel
    groups (`dlrt.distributed.data_parallel`; size 1 without), after checking, before any
    weight loads, that the model splits evenly, every rank of the job opened the same
    checkpoint and the options fit. Without either, no ranks are joined (control None).

    Raises:
        ConfigError: a size that does not split (`check_sizes`).
        CheckpointError: ranks that opened different checkpoints.
        OptionError: ranks with other engine options, quantised weights, or CUDA graphs
            without an all-reduce they can hold.
    """
    size = config.tensor_parallel_size
    if size == 1 and config.data_parallel_size == 1:
        return TensorParallel(0, 1), DataParallel()
    check_sizes(mconfig, size)
    ranks = Ranks()
    same = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("device", "model")}
    check_ranks_agree(ranks, folder, same)
    if scheme is not None and size > 1:
        raise OptionError(f"tensor_parallel_size {size} with {scheme.name} weights: sharded "
                          "quantised weights (block scales cut with their rows) are not built "
                          "yet; use unquantised weights or tensor_parallel_size 1")
    dp = data_parallel(ranks, config.data_parallel_size)
    if size == 1:
        return TensorParallel(0, 1, control=dp.control), dp
    return tensor_parallel_group(dp.control, config.torch_device, config.execution_mode), dp


def _load(config: ModelConfig, ops: Ops, folder: CheckpointFolder, engine: EngineConfig,
          scheme: QuantScheme | None, tp: TensorParallel) -> nn.Module:
    """Build on the meta device, cut it to this rank's share (tensor parallelism), convert the
    quantised modules, materialise on the engine's device, fill the weights (quantising them
    while loading for an online scheme; a rank reads only its slices)."""
    with torch.device("meta"):
        model = build_model(config, ops)
    cut = shard_model(model, config, family(config.family), tp)
    if cut:
        log.info("rank %d of %d: %d module(s) cut", tp.rank, tp.size, len(cut))
    if scheme is not None:
        names = quantize_model(model, config.hidden_size, scheme, set(folder.tensor_files))
        scheme.fmt.set_activations(model, engine.fp8_activations)
        log.info("%s weights in %d module(s)%s", scheme.name, len(names),
                 " (quantised while loading)" if scheme.online else "")
    materialize(model, engine.torch_dtype, engine.torch_device)
    if engine.load_format == "dummy":
        init_dummy(model, engine.seed, config.initializer_range, engine.torch_dtype)
    else:
        load_safetensors(model, folder, online=scheme is not None and scheme.online)
    if scheme is not None:
        scheme.fmt.check_activations(model, ops, engine.torch_dtype, engine.torch_device)
    return model.eval()


def _kv_cache(config: ModelConfig, engine: EngineConfig, model: nn.Module,
              folder: CheckpointFolder, tp_size: int = 1) -> PagedKVCache:
    """The paged KV cache in the model dtype, or in FP8 with the checkpoint's per-layer
    k_scale / v_scale (`dlrt.checkpoint.kv_scales`; 1.0 when it holds none); with tensor
    parallelism, of this rank's KV heads; one head shape per layer where layers differ
    (`ModelConfig.kv_shapes`)."""
    kv_dtype = engine.torch_kv_cache_dtype
    scales = None
    if kv_dtype == KV_FP8:
        scales = read_kv_scales(model, folder) if engine.load_format != "dummy" else None
        log.info("FP8 KV cache (e4m3), %s", "the checkpoint's per-layer k/v scales"
                 if scales else "scales 1.0 (the checkpoint holds no k_scale / v_scale)")
    k_scale, v_scale = scales or (None, None)
    shapes = [(kv // tp_size, d) for kv, d in config.kv_shapes()]
    return PagedKVCache(config.num_layers, config.num_kv_heads // tp_size, config.head_dim,
                        engine.max_model_len, kv_dtype, engine.torch_device,
                        k_scale=k_scale, v_scale=v_scale, layer_shapes=shapes)


def _report_quantization(scheme: QuantScheme | None, device: torch.device) -> None:
    """Say which path serves quantised weights: the dequantising reference on the CPU; on a
    GPU the format's note for its compute capability (`QuantFormat.path_note`: a warning where
    that path is slower than the unquantised model)."""
    if scheme is None:
        return
    if device.type != "cuda":
        log.info("%s weights on the CPU: the dequantising reference path", scheme.name)
        return
    note = scheme.fmt.path_note(torch.cuda.get_device_capability(device))
    if note is not None:
        log.log(logging.WARNING if note.slow else logging.INFO, "%s", note.text)


def _plan_linears(model: nn.Module, config: EngineConfig, block_length: int) -> LinearPlan:
    """On CUDA with the Triton kernels: per weight shape, cuBLAS or the skinny Triton GEMM, and
    for the FP8 (block-layout) and NVFP4 layers the dequantising reference or a checked
    low-precision kernel (timed once per device at the rows of a default request's block,
    `block_length`, at most 16, then cached). Otherwise cuBLAS everywhere and the reference
    path for quantised layers."""
    if config.linear_kernels == "cublas":  # resolved: also where no timing can apply
        return tune(model, policy="cublas")
    rows = min(block_length, 16)
    plan = tune(model, rows=rows, policy=config.linear_kernels)
    methods, records = tune_quant(model, config.torch_dtype, rows=rows,
                                  policy=config.linear_kernels)
    plan.methods.update(methods)
    plan.records.update(records)
    return plan



def _persistent_rounds(model: nn.Module, cache: PagedKVCache, block_length: int):
    """The persistent round kernel for the block decoder's rounds (round_kernel='persistent';
    what it serves was checked by `EngineConfig.resolve`).

    Raises:
        OptionError: a size, GPU or plan the kernel does not serve (named)."""
    from dlrt.runtime.persistent.kernel import PersistentRounds

    try:
        return PersistentRounds(model, cache, block_length)
    except ValueError as e:
        raise OptionError(f"round_kernel 'persistent': {e}") from e
