"""The second step of the engine options (`EngineConfig.resolve_device` and `resolve`): the
values that turn options into concrete ones for a device and one checkpoint folder, and
the checks behind them. Nothing here builds a part or reads a weight."""

from __future__ import annotations

import logging
from typing import Any

import torch

from dlrt.distributed.ranks import local_ranks, world_size
from dlrt.errors import ConfigError, OptionError
from dlrt.models.config import ModelConfig
from dlrt.models.registry import family

log = logging.getLogger(__name__)


def check_persistent(**needs: Any) -> None:
    """Raises OptionError with the persistent round's reason when it does not serve `needs`
    (`PersistentRounds.supports`)."""
    from dlrt.runtime.persistent.kernel import PersistentRounds

    why = PersistentRounds.supports(**needs)
    if why is not None:
        raise OptionError(why)


def linear_kernels(policy: str, kernels: str, device: torch.device) -> str:
    """The linear policy that applies (`policy`, the option's): a timed choice needs CUDA and
    the Triton ops (`kernels`)."""
    if device.type == "cuda" and kernels == "triton":
        return policy
    if policy == "triton":
        log.warning("linear_kernels='triton' needs CUDA and kernels='triton'; projections run "
                    "on %s with F.linear", device.type)
    return "cublas"


def tensor_parallel_size(size: int | None, device: str, data_parallel: int = 1) -> int:
    """The tensor-parallel size: given, else torchrun's world size divided by the
    data-parallel size. Without data parallelism it must be 1 or the world size; with it
    (`data_parallel` > 1) data_parallel x tensor_parallel_size must be the world size. A host's
    ranks need a GPU each when the model runs on CUDA."""
    world = world_size()
    now = "this process was started without torchrun" if world == 1 else \
        f"torchrun started {world}"
    if data_parallel > 1:
        if size is None and world % data_parallel:
            raise OptionError(
                f"data_parallel_size {data_parallel} needs a multiple of {data_parallel} "
                f"processes, data_parallel_size x tensor_parallel_size ({now}): start them with "
                f"torchrun --nproc-per-node (x --nnodes)")
        tp = world // data_parallel if size is None else size
        if tp * data_parallel != world:
            raise OptionError(
                f"data_parallel_size {data_parallel} x tensor_parallel_size {tp} needs "
                f"{data_parallel * tp} processes ({now}): start them with torchrun "
                f"--nproc-per-node (x --nnodes)")
    else:
        tp = world if size is None else size
    if data_parallel == 1 and tp not in (1, world):
        raise OptionError(f"tensor_parallel_size {tp} needs {tp} processes, one per rank: start "
                          f"them with torchrun --nproc-per-node {tp} ({now})")
    if (tp > 1 or data_parallel > 1) and torch_device(device).type == "cuda":
        here, gpus = local_ranks()[1], torch.cuda.device_count()
        if here > gpus:
            raise OptionError(f"{here} ranks on this host but only {gpus} GPU(s) "
                              f"(tensor_parallel_size {tp}, data_parallel_size {data_parallel}): "
                              f"start at most {gpus} ranks per host")
    return tp


def torch_device(device: str) -> torch.device:
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


def context_limit(config: ModelConfig, max_model_len: int | None) -> int:
    """The context in tokens: `max_model_len`, else the config's maximum.

    Raises:
        OptionError: max_model_len outside [1, the config's maximum], or (a canvas family)
            below canvas_length + 1, which no request fits.
    """
    limit = config.max_position_embeddings
    if max_model_len is None:
        return limit
    if not 1 <= max_model_len <= limit:
        raise OptionError(f"max_model_len={max_model_len!r} must be in [1, {limit}]")
    canvas = config.canvas_length
    if canvas is not None and max_model_len <= canvas:
        raise OptionError(f"max_model_len={max_model_len} leaves no room for a canvas: a request "
                          f"needs a prompt token and canvas_length={canvas} positions; set it to "
                          f"at least {canvas + 1}")
    return max_model_len


def mask_token(config: ModelConfig, option: int | None, tokenizer_mask: int | None,
               renoise: bool = False) -> int | None:
    """The mask token: the option's, else the config's, else the tokenizer's; None for a
    renoising family (`renoise`: its canvases hold no mask token).

    Raises:
        OptionError: an option outside the vocabulary, or any option for a renoising family.
        ConfigError: none anywhere (a family that denoises mask tokens).
    """
    if renoise:
        if option is not None:
            raise OptionError(f"mask_token_id={option!r}: {config.family} models have no mask "
                              "token (renoising decoding: a rejected position gets a random "
                              "token); leave it unset")
        return None
    if option is not None:
        if not 0 <= option < config.vocab_size:
            raise OptionError(f"mask_token_id={option!r} is not a token id of the vocabulary")
        return option
    if config.mask_token_id is not None:
        return int(config.mask_token_id)
    if tokenizer_mask is not None:
        return int(tokenizer_mask)
    raise ConfigError("config.json has no mask_token_id and the tokenizer no mask token; "
                      "pass mask_token_id=...")


def eos_ids(generation_config: dict[str, Any], config: ModelConfig) -> tuple[int, ...]:
    """generation_config.json's eos ids (else config.json's) plus the family's stop ids."""
    gen_eos = generation_config.get("eos_token_id")
    eos = tuple(gen_eos if isinstance(gen_eos, list) else [gen_eos]) if gen_eos is not None \
        else config.eos_token_ids
    return tuple(dict.fromkeys(eos + family(config.family).stop_ids))
