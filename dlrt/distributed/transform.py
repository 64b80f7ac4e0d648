"""Tensor parallelism: one model cut across the ranks of a torchrun job, as a transform of the
model built on the meta device (before any weight is read), so model files do not mention it.

What rank r of N holds (`shard_model`):
  - attention: query heads [r Hq/N, (r+1) Hq/N) and KV heads [r Hkv/N, (r+1) Hkv/N) (the GQA
    groups stay whole), so its KV cache holds only its KV heads; the fused QKV projection
    holds those heads' rows (column parallel), the output projection those heads' columns
    (row parallel: its output is a partial sum, completed by the all-reduce);
  - SwiGLU: the rank's gate and up rows (column parallel), the down projection's matching
    columns (row parallel, summed);
  - MoE: the router on every rank (each rank routes every token the same way); experts
    [r E/N, (r+1) E/N) (expert parallel, `ExpertParallel`); a shared expert column/row
    parallel; one sum per layer for routed and shared together;
  - LM head: vocabulary rows [r V/N, (r+1) V/N) (vocabulary parallel); the round's candidates
    are formed without gathering the logits where the strategy allows it (`VocabShard`);
  - embedding, norms, rotary tables: whole on every rank (a round reads B embedding rows).

Every sum goes through `TensorParallel.all_reduce` (`dlrt.distributed.group`).
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from dlrt.distributed.group import TensorParallel
from dlrt.errors import ConfigError
from dlrt.layers.attention import Attention
from dlrt.layers.linear import LinearBase, MergedLinear
from dlrt.layers.mlp import SwiGLU
from dlrt.layers.moe import FusedMoE
from dlrt.layers.moe.parallel import ExpertParallel
from dlrt.layers.shard import Shard
from dlrt.models.config import ModelConfig
from dlrt.models.family import Family


def check_sizes(config: ModelConfig, size: int) -> None:
    """Raise ConfigError naming every size of `config` that `size` ranks cannot split evenly
    (attention heads, KV heads, MLP and expert widths, experts, vocabulary), or the attention
    needs that are not cut yet (sliding windows, per-layer head shapes: DiffusionGemma);
    before any weight loads."""
    if size == 1:
        return
    if config.attention_needs():
        raise ConfigError(f"tensor_parallel_size {size}: tensor parallelism does not serve "
                          f"this model's attention ({', '.join(config.attention_needs())}) "
                          "yet; use tensor_parallel_size 1")
    sizes = {"num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
             "vocab_size": config.vocab_size}
    dense = len(config.moe_layers) < config.num_layers
    if dense:
        sizes["intermediate_size"] = config.intermediate_size
    if config.moe_layers:
        sizes["num_experts"] = config.num_experts
        if config.num_shared_experts:
            sizes["shared expert width"] = config.moe_intermediate_size * \
                config.num_shared_experts
    bad = [f"{name} {n}" for name, n in sizes.items() if n % size]
    if bad:
        raise ConfigError(f"tensor_parallel_size {size} does not divide {', '.join(bad)} of "
                          f"this model; use a size that divides them")



def _meta(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


def _column(layer: LinearBase, tp: TensorParallel, groups: tuple[int, ...] = ()) -> None:
    """The rank's rows: of each part of a merged projection, else of each row group, else of
    the whole weight."""
    n = tp.size
    if isinstance(layer, MergedLinear):
        layer.parts = tuple((name, rows // n) for name, rows in layer.parts)
        shard = Shard(0, tp.rank, n)
    else:
        shard = Shard(0, tp.rank, n, groups=groups if len(groups) > 1 else ())
    layer.out_features //= n
    layer.weight = _meta(layer.out_features, layer.in_features)
    layer.shards = {"weight": shard}


def _row(layer: LinearBase, tp: TensorParallel, reduce: bool = True) -> None:
    """The rank's input columns; `reduce`: the layer sums its output over the ranks."""
    layer.in_features //= tp.size
    layer.weight = _meta(layer.out_features, layer.in_features)
    layer.shards = {"weight": Shard(1, tp.rank, tp.size)}
    layer.reduce = tp.all_reduce if reduce else None


def _vocab(model: nn.Module, name: str, head: LinearBase, family: Family,
           tp: TensorParallel) -> None:
    """The rank's vocabulary rows; a head tied to the embedding reads the embedding's rows."""
    tied = dict(model.named_parameters(remove_duplicate=False)).get(family.embedding)
    key = family.embedding if tied is head.weight and name + ".weight" != family.embedding \
        else None
    head.out_features //= tp.size
    head.weight = _meta(head.out_features, head.in_features)
    head.shards = {"weight": Shard(0, tp.rank, tp.size, key=key)}


def _experts(moe: FusedMoE, tp: TensorParallel) -> None:
    ex = moe.experts
    count = ex.num_experts // tp.size
    ex.num_experts, ex.first_expert = count, tp.rank * count
    ex.w13 = _meta(count, 2 * ex.intermediate, ex.hidden)
    ex.w2 = _meta(count, ex.hidden, ex.intermediate)
    moe.method = ExpertParallel(moe.method, ex.first_expert, count)
    if moe.shared_experts is not None:
        _column(moe.shared_experts.gate_up_proj, tp)
        _row(moe.shared_experts.down_proj, tp, reduce=False)  # summed with the routed share
    moe.reduce = tp.all_reduce


def shard_model(model: nn.Module, config: ModelConfig, family: Family,
                tp: TensorParallel) -> list[str]:
    """Cut a model built on the meta device to rank `tp.rank`'s share (module docstring), in
    place, before it is materialised and loaded. Returns the names of the modules cut.

    Raises:
        ConfigError: a size `tp.size` does not divide (`check_sizes`), or a module the
            family's `tp_plan` names that is not a linear layer.
    """
    if tp.size == 1:
        return []
    check_sizes(config, tp.size)
    modules = dict(model.named_modules())
    in_moe = {id(m.shared_experts) for m in modules.values()
              if isinstance(m, FusedMoE) and m.shared_experts is not None}
    done = []
    qkv_groups = (config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim,
                  config.num_kv_heads * config.head_dim)
    for name, module in modules.items():
        kind = next((k for pattern, k in family.tp_plan if fnmatch.fnmatchcase(name, pattern)),
                    None)
        if kind is not None:
            if not isinstance(module, LinearBase):
                raise ConfigError(f"tp_plan of {family.name} names {name}, which is a "
                                  f"{type(module).__name__}, not a linear layer")
            if kind == "heads":
                _column(module, tp, qkv_groups)
            elif kind == "column":
                _column(module, tp)
            elif kind == "row":
                _row(module, tp)
            elif kind == "vocab":
                _vocab(model, name, module, family, tp)
            else:
                raise ConfigError(f"tp_plan of {family.name}: unknown kind {kind!r}")
        elif isinstance(module, FusedMoE):
            _experts(module, tp)
        elif isinstance(module, SwiGLU) and id(module) not in in_moe:
            _column(module.gate_up_proj, tp)
            _row(module.down_proj, tp)
        elif isinstance(module, Attention):
            module.num_heads //= tp.size
            module.num_kv_heads //= tp.size
        else:
            continue
        done.append(name)
    return done

