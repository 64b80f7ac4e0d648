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

Every sum goes through `TensorParallel.all_reduce`, whose result is the same on every rank, so
all ranks commit the same tokens and run the same number of rounds without asking anyone.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
from dataclasses import dataclass

import torch
from torch import nn

from dlrt.config.model import ModelConfig
from dlrt.decoding.round import RoundKind
from dlrt.decoding.strategies import NEEDS_CREDIT, NEEDS_ENTROPY
from dlrt.errors import CheckpointError, ConfigError, OptionError
from dlrt.layers.attention import Attention
from dlrt.layers.linear import LinearBase, MergedLinear
from dlrt.layers.mlp import SwiGLU
from dlrt.layers.moe import FusedMoE
from dlrt.layers.moe.parallel import ExpertParallel
from dlrt.layers.shard import Shard
from dlrt.models.family import Family


class TensorParallel:
    """The ranks of one tensor-parallel model: this rank, their number, and the two collectives
    a forward and a round use. `size` 1 is a no-op group.

    Args:
        rank, size: this process's rank and the number of ranks.
        group: the torch.distributed process group of the ranks (gloo on the CPU, NCCL on
            CUDA without a reducer); None when size is 1 or a reducer serves every sum.
        reducer: an all-reduce to use instead of the group's: an object with
            `all_reduce(x) -> sum over the ranks` (out of place, the same bits on every rank)
            and `capacity_bytes` (its largest message): the fused peer-to-peer all-reduce
            (`dlrt.distributed.p2p.P2PAllReduce`) that CUDA graphs and WHILE bodies can hold.
            Larger tensors go through it in row chunks.
        control: the ranks' control channel (`dlrt.distributed.ranks.Ranks`) for host values
            every rank must agree on (`share`).
    """

    def __init__(self, rank: int, size: int, group=None, reducer=None, control=None):
        self.rank, self.size, self.group, self.reducer = rank, size, group, reducer
        self.control = control

    def share(self, value):
        """Rank 0's host `value` on every rank (every rank calls it): a request's seed."""
        return value if self.size == 1 else self.control.share(value)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The reducer's sum of x, in chunks of whole rows that fit its capacity."""
        x = x.contiguous()
        flat = x.view(x.shape[0], -1) if x.dim() > 1 else x.view(-1, 1)
        per = max(1, self.reducer.capacity_bytes // (flat.shape[1] * x.element_size()))
        if flat.shape[0] <= per:
            return self.reducer.all_reduce(x)
        return torch.cat([self.reducer.all_reduce(c) for c in flat.split(per)]).view(x.shape)

    def barrier(self) -> None:
        """Wait on the host until every rank gets here, its device work done (over the control
        channel: no device collective)."""
        if self.size > 1:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.control.all_gather(None)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks (a new tensor, x's shape and dtype)."""
        if self.size == 1:
            return x
        if self.reducer is not None:
            return self._reduce(x)
        import torch.distributed as dist

        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., n] of every rank concatenated along the last dim in rank order:
        [..., size * n]. With a reducer: each rank's x in its own slot of a zero tensor,
        summed (adding zeros changes no bit), so it runs wherever the all-reduce does."""
        if self.size == 1:
            return x
        if self.reducer is not None:
            n = x.shape[-1]
            out = x.new_zeros(*x.shape[:-1], self.size * n)
            out[..., self.rank * n:(self.rank + 1) * n] = x
            return self._reduce(out)
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def check_sizes(config: ModelConfig, size: int) -> None:
    """Raise ConfigError naming every size of `config` that `size` ranks cannot split evenly
    (attention heads, KV heads, MLP and expert widths, experts, vocabulary); before any
    weight loads."""
    if size == 1:
        return
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


COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # a forward's sum waiting for a peer
SAMPLE_BYTES = 1 << 16  # bytes read from each weight file's start, middle and end


def checkpoint_fingerprint(folder) -> str:
    """A short hash of what a rank is about to load: config.json, every tensor's name and
    file, and each weight file's size and three 64 KiB samples of its bytes (two checkpoints
    of one config with other weights differ; the files are not read whole)."""
    h = hashlib.sha256((folder.path / "config.json").read_bytes())
    for key, path in sorted(folder.tensor_files.items()):
        h.update(f"{key}@{path.name}".encode())
    for path in sorted(set(folder.tensor_files.values())):
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            for at in (0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)):
                f.seek(at)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def check_ranks_agree(ranks, folder, options: dict) -> None:
    """Raise before any weight loads when the ranks would build different models: another
    checkpoint (CheckpointError naming each rank's folder) or other engine options
    (OptionError naming the option and each rank's value). `options`: the resolved engine
    options that must match (the device and the folder's path may differ)."""
    every = ranks.gather_at_load((str(folder.path), checkpoint_fingerprint(folder), options))
    if any(fp != every[0][1] for _, fp, _ in every):
        listed = "; ".join(f"rank {r}: {p} ({fp})" for r, (p, fp, _) in enumerate(every))
        raise CheckpointError(f"the tensor-parallel ranks disagree on the checkpoint "
                              f"(config.json or weights differ): {listed}")
    for name in options:
        values = [o.get(name) for _, _, o in every]
        if any(v != values[0] for v in values):
            listed = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise OptionError(f"the tensor-parallel ranks disagree on {name} ({listed}); "
                              "every rank must create LLM(...) with the same arguments")


# -- the transform --------------------------------------------------------------------------
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


# -- the LM head's candidates ---------------------------------------------------------------
@dataclass(frozen=True)
class VocabShard:
    """The round's candidates from a vocabulary-parallel LM head: this rank's logits are
    [n, V/N], of ids [lo, lo + V/N).

    What a round exchanges, per position and rank:
      - greedy rounds of every strategy but `credit` and `entropy_bounded`: 3 fp32 values
        (the shard's max logit, its id, and the sum of exp(logit - max) over the shard); the
        candidate is the id of the largest max (the lowest rank on a tie: the lowest id, as
        torch's argmax), its confidence exp(0) / sum_r s_r exp(m_r - m) (the softmax maximum);
      - sampled rounds, `credit` (its credit is a [B, V] buffer fused with the logits) and
        `entropy_bounded` (the entropy of the full distribution): the logits, gathered to
        [n, V] on every rank; the round then runs as with one rank. Sampling could exchange
        per-shard Gumbel maxima instead, but its top-k / top-p filters need the global order.
    """

    tp: TensorParallel
    vocab_size: int
    mask_token_id: int

    @property
    def lo(self) -> int:
        return self.tp.rank * (self.vocab_size // self.tp.size)

    def local(self, kind: RoundKind) -> bool:
        """Whether a round of `kind` forms its candidates from the shards' summaries."""
        return kind.sampling.greedy and kind.strategy not in NEEDS_CREDIT | NEEDS_ENTROPY

    def for_round(self, logits: torch.Tensor, kind: RoundKind, candidates_op):
        """(logits, candidates op) for `dlrt.decoding.round.denoise_round`: this rank's
        logits and the sharded greedy op, or the gathered [n, V] logits and `candidates_op`."""
        if self.local(kind):
            return logits, self.greedy
        return self.tp.all_gather(logits), candidates_op

    def greedy(self, logits: torch.Tensor, sampling, mode, round_idx, positions,
               mask_token_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [n] int64, confidences [n] fp32) of the whole vocabulary from this rank's
        logits [n, V/N]; the mask token (wherever it lives) is never a candidate."""
        x = logits.float()
        width = x.shape[1]
        mask = mask_token_id - self.lo
        if 0 <= mask < width:
            x = x.clone() if x is logits else x
            x[:, mask] = float("-inf")
        m, idx = x.max(dim=-1)  # [n]
        empty = torch.isneginf(m)  # no finite logit in this shard: it adds nothing
        s = torch.exp(x - torch.where(empty, 0.0, m)[:, None]).sum(dim=-1)
        s = torch.where(empty, 0.0, s)
        mine = torch.stack([m, (idx + self.lo).float(), s], dim=-1)  # [n, 3]
        every = self.tp.all_gather(mine).view(x.shape[0], self.tp.size, 3)
        best = every[:, :, 0].argmax(dim=-1, keepdim=True)  # [n, 1], first max: lowest rank
        top = every[:, :, 0].gather(1, best)  # [n, 1]
        ids = every[:, :, 1].gather(1, best)[:, 0].long()
        scale = torch.exp(every[:, :, 0] - top)
        total = (every[:, :, 2] * torch.where(torch.isneginf(every[:, :, 0]), 0.0, scale)).sum(-1)
        return ids, 1.0 / total


def tensor_parallel_group(ranks, device: torch.device, execution_mode: str) -> TensorParallel:
    """The group of every torchrun rank for one tensor-parallel model.

    CPU: a gloo group. CUDA: when every pair of the host's GPUs can reach each other's memory,
    the fused peer-to-peer all-reduce (`dlrt.distributed.p2p`) serves every sum in every
    execution mode (the same kernel everywhere, so the modes commit the same tokens); else an
    NCCL group, and as NCCL collectives cannot run inside a CUDA graph's WHILE body,
    `device_loop` is refused.

    Raises:
        OptionError: ranks sharing a GPU; device_loop on GPUs without peer access.
    """
    import torch.distributed as dist

    if device.type != "cuda":
        return TensorParallel(ranks.rank, ranks.world,
                              dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT),
                              control=ranks)
    torch.cuda.set_device(device)
    from dlrt.distributed.p2p import P2PAllReduce, p2p_supported
    from dlrt.distributed.ranks import local_ranks

    devices = ranks.all_gather(device.index)
    if len(set(devices)) < len(devices):
        raise OptionError(f"tensor parallelism needs a GPU per rank; the ranks' devices are "
                          f"{[f'cuda:{d}' for d in devices]} (leave device at auto: rank r "
                          "takes cuda:<local rank>)")
    ok, why = (p2p_supported(device, devices) if local_ranks()[1] == ranks.world
               else (False, "the ranks span more than one host"))
    every = ranks.all_gather((ok, why))  # every rank takes the same path (setup is collective)
    ok, why = all(o for o, _ in every), next((w for o, w in every if not o), why)
    if ok:
        # NOTE: a rank waits on the device for its peers at every sum; ranks may drift apart by
        # seconds (kernel builds, tuning on first use), so the wait before an error is long.
        reducer = P2PAllReduce(ranks.group, ranks.rank, ranks.world, device, timeout_s=120.0)
        return TensorParallel(ranks.rank, ranks.world, None, reducer, control=ranks)
    if execution_mode == "device_loop":
        raise OptionError(f"execution_mode device_loop with tensor parallelism needs the "
                          f"peer-to-peer all-reduce, and {why}; use execution_mode host_loop "
                          f"(NCCL in captured rounds) or eager")
    group = dist.new_group(backend="nccl", timeout=COLLECTIVE_TIMEOUT)
    return TensorParallel(ranks.rank, ranks.world, group, control=ranks)
