"""The tensor-parallel group: this rank, the number of ranks, and the two collectives a forward
and a round use (`TensorParallel`); `tensor_parallel_group` builds it over gloo (CPU), the fused
peer-to-peer all-reduce (CUDA, `dlrt.distributed.p2p`) or NCCL. Every sum's result is the same
on every rank, so all ranks commit the same tokens and run the same number of rounds without
asking anyone."""

from __future__ import annotations

import datetime

import torch

from dlrt.errors import OptionError

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # a forward's sum waiting for a peer


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
        control: the ranks' control channel (`dlrt.distributed.ranks.Ranks`; the LLM's
            calls go over it).
    """

    def __init__(self, rank: int, size: int, group=None, reducer=None, control=None):
        self.rank, self.size, self.group, self.reducer = rank, size, group, reducer
        self.control = control

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The reducer's sum of x, in chunks of whole rows that fit its capacity."""
        x = x.contiguous()
        flat = x.view(x.shape[0], -1) if x.dim() > 1 else x.view(-1, 1)
        per = max(1, self.reducer.capacity_bytes // (flat.shape[1] * x.element_size()))
        if flat.shape[0] <= per:
            return self.reducer.all_reduce(x)
        return torch.cat([self.reducer.all_reduce(c) for c in flat.split(per)]).view(x.shape)

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

    def close(self) -> None:
        """Collective (every rank, once no forward runs): release the reducer's buffers (the
        peer-to-peer all-reduce: in rank order over the control channel), then leave the
        group. Later calls do nothing."""
        if self.reducer is not None:
            self.reducer.close()
            self.reducer = None
        if self.group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)
            self.group = None


def tensor_parallel_group(ranks, device: torch.device, execution_mode: str) -> TensorParallel:
    """The group of the ranks `ranks` (a `Ranks`: every torchrun rank; a `Subgroup`: one
    data-parallel group's) for one tensor-parallel model; every rank of the job calls it.

    CPU: a gloo group. CUDA: when every pair of the host's GPUs can reach each other's memory,
    the fused peer-to-peer all-reduce (`dlrt.distributed.p2p`) serves every sum in every
    execution mode (the same kernel everywhere, so the modes commit the same tokens); else an
    NCCL group, and as NCCL collectives cannot run inside a CUDA graph's WHILE body,
    `device_loop` is refused.

    Raises:
        OptionError: ranks sharing a GPU; device_loop on GPUs without peer access.
    """
    if device.type != "cuda":
        return TensorParallel(ranks.rank, ranks.world,
                              ranks.new_group("gloo", COLLECTIVE_TIMEOUT), control=ranks)
    torch.cuda.set_device(device)
    from dlrt.distributed.p2p import P2PAllReduce, p2p_supported
    from dlrt.distributed.ranks import local_ranks, process_rank

    devices = ranks.all_gather(device.index)
    if len(set(devices)) < len(devices):
        raise OptionError(f"tensor parallelism needs a GPU per rank; the ranks' devices are "
                          f"{[f'cuda:{d}' for d in devices]} (leave device at auto: rank r "
                          "takes cuda:<local rank>)")
    # (torchrun numbers a host's ranks consecutively: rank - local rank is the host's first)
    hosts = ranks.all_gather(process_rank() - local_ranks()[0])
    ok, why = (p2p_supported(device, devices) if len(set(hosts)) == 1
               else (False, "the ranks span more than one host"))
    # every rank of the job takes the same path (making a group is collective over the job)
    every = ranks.gather_at_load((ok, why))
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
    group = ranks.new_group("nccl", COLLECTIVE_TIMEOUT)
    return TensorParallel(ranks.rank, ranks.world, group, control=ranks)
