"""torchrun's ranks: who this process is (`world_size`, `process_rank`, `local_ranks`) and the
ranks' control channel (`Ranks`: a gloo group, host memory, never NCCL) that carries the load-time
checks and rank 0's calls (`dlrt.distributed.calls`). One process: every call is a no-op.
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
