"""torchrun's ranks: who this process is (`world_size`, `process_rank`, `local_ranks`) and the
ranks' control channel (`Ranks`: a gloo group, host memory, never NCCL) that carries the load-time
checks and rank 0's calls (`dlrt.distributed.calls`). One process: every call is a no-op.

`Subgroup`: the same channel over some of the ranks (a data-parallel group's ranks; rank 0 and
another group's leader), made by every rank of the job together (`Ranks.subgroup`).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

LOAD_TIMEOUT = datetime.timedelta(minutes=10)


def world_size() -> int:
    """The number of ranks torchrun started (WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def process_rank() -> int:
    """This process's rank among torchrun's (RANK; 0 without torchrun)."""
    return int(os.environ.get("RANK", "0"))


def local_ranks() -> tuple[int, int]:
    """(this process's rank on its host, the number of ranks on its host): torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE; (0, 1) without torchrun."""
    return (int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))))


class Ranks:
    """This process's rank among torchrun's and a gloo group of every rank (joining the
    default group when nothing has; `close` leaves what it joined)."""

    def __init__(self):
        self.world = world_size()
        self.rank = process_rank()
        self._group = None
        self._owns_default = False
        if self.world > 1:
            import torch.distributed as dist

            # NOTE: NVLink multicast stays off (it can take the host's GPUs down).
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            # the default group (start-up, load-time checks) gives up after LOAD_TIMEOUT: a
            # rank that never arrives is an error, not a hang; the control channel waits
            # for requests forever
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=LOAD_TIMEOUT)
                self._owns_default = True
            self._group = dist.new_group(backend="gloo",
                                         timeout=datetime.timedelta(days=365))

    @property
    def group(self):
        """The ranks' gloo group (None in one process)."""
        return self._group

    def new_group(self, backend: str, timeout: datetime.timedelta):
        """A new process group of every rank (`dist.new_group`; every rank calls it)."""
        import torch.distributed as dist

        return dist.new_group(backend=backend, timeout=timeout)

    def subgroup(self, members: list[int], partition: list[list[int]] | None = None
                 ) -> Subgroup | None:
        """A control channel of the ranks `members` (global ranks, ascending); every rank of
        the job calls it with the same arguments, in the same order (`dist.new_group`), and
        gets None where it is not a member. `partition`: the member lists of every group of
        the same kind (data-parallel groups), so that `Subgroup.new_group` makes one process
        group for each of them."""
        import torch.distributed as dist

        group = dist.new_group(members, backend="gloo", timeout=datetime.timedelta(days=365))
        if self.rank not in members:
            return None
        return Subgroup(self, members, group, partition or [members])

    def gather_at_load(self, obj: Any) -> list[Any]:
        """Every rank's `obj` in rank order, over the default group: it gives up after
        LOAD_TIMEOUT with a DlrtError saying every rank must load the same model."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        from dlrt.errors import DlrtError

        out: list[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj)
        except RuntimeError as e:
            raise DlrtError(f"rank {self.rank}: the other ranks did not all reach the model "
                            f"load ({e}); every rank must create LLM(...) with the same "
                            "arguments, and none may have stopped") from e
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (over the gloo group)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def close(self) -> None:
        """Leave the process group this object joined (the default group too when it made it,
        which ends every group of this process). Later calls do nothing."""
        if self._group is None:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            if self._owns_default:
                dist.destroy_process_group()
            else:
                dist.destroy_process_group(self._group)
        self._group = None


class Subgroup:
    """The control channel of some of the ranks (`Ranks.subgroup`): `Ranks`' interface over a
    gloo group of `members` (global ranks). `world` is their number, `rank` this process's
    place among them, `first` the global rank of the first (for messages that name ranks).
    `gather_at_load` stays over every rank of the job (a load goes on everywhere or nowhere).
    """

    def __init__(self, parent: Ranks, members: list[int], group, partition: list[list[int]]):
        self.parent, self.members, self.partition = parent, list(members), partition
        self.world = len(members)
        self.rank = self.members.index(parent.rank)
        self.first = self.members[0]
        self._group = group

    @property
    def group(self):
        """The members' gloo group (None once closed)."""
        return self._group

    def gather_at_load(self, obj: Any) -> list[Any]:
        """Every rank's `obj` of the whole job, in global rank order (`Ranks.gather_at_load`)."""
        return self.parent.gather_at_load(obj)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every member's `obj`, in member order, on every member."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def new_group(self, backend: str, timeout: datetime.timedelta):
        """A new process group of the members: every rank of the job calls it (one group is
        made for each member list of the partition, in order); this rank's."""
        import torch.distributed as dist

        mine = None
        for members in self.partition:
            group = dist.new_group(members, backend=backend, timeout=timeout)
            if self.parent.rank in members:
                mine = group
        return mine

    def close(self) -> None:
        """Leave the members' group (the job's default group stays: `Ranks.close`). Later
        calls do nothing."""
        if self._group is None:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group(self._group)
        self._group = None
