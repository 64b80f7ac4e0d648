"""Data parallelism: `data_parallel_size` D whole engines side by side in one torchrun job.

The job's W ranks form D groups of W / D consecutive ranks (group g: global ranks
[g W/D, (g+1) W/D)); each group loads the whole model (cut across its ranks when W / D > 1:
tensor parallelism) and is led by its first rank, which shares its calls with the group's other
ranks (`dlrt.distributed.calls`). Rank 0 leads group 0 and hands work to the other groups'
leaders, each over a link of its own (`dlrt.distributed.links`); a leader runs what it gets on
its own group, so the groups run side by side.

`share_by_cost` says which group runs which of a list of requests; `outcomes` runs a group's
share, `alongside` waits for the other groups' while rank 0 runs its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from dlrt.distributed.calls import Calls, OutOfStep
from dlrt.distributed.links import RemoteGroup, sendable
from dlrt.distributed.ranks import Ranks


def share_by_cost(costs: Sequence[int], groups: int) -> list[list[int]]:
    """The indices of `costs` that each of `groups` groups runs: taken longest first (ties:
    the lower index), each to the group whose share costs least so far (ties: the lower
    group); each group's indices ascending. A request's estimated cost is its prompt tokens
    plus its max_new_tokens.

    Raises:
        ValueError: groups < 1.
    """
    if groups < 1:
        raise ValueError(f"groups={groups} must be >= 1")
    totals, shares = [0] * groups, [[] for _ in range(groups)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        g = min(range(groups), key=lambda g: (totals[g], g))
        shares[g].append(i)
        totals[g] += costs[i]
    return [sorted(s) for s in shares]


def outcomes(group: Any, indices: list[int], run: Callable[[Any, int], Any], rank: int
             ) -> dict[int, tuple[Any, BaseException | None]]:
    """{index: (run(group, index), None) or (None, its exception)} for each of `indices`, in
    order: a failed request does not stop the rest of the share (`rank`: the global rank
    that runs them, named where an exception cannot be sent). OutOfStep is raised."""
    out = {}
    for i in indices:
        try:
            out[i] = (run(group, i), None)
        except OutOfStep:
            raise
        except Exception as e:
            out[i] = (None, sendable(e, f"rank {rank}"))
    return out


def alongside(futures: list[Future], fn: Callable[..., Any], *args: Any
              ) -> tuple[Any, list[Any]]:
    """(fn(*args), the futures' values) once fn and every future have ended (the other
    groups' work goes on while this rank runs its own); raises the first error, fn's before
    the futures', theirs in order."""
    try:
        mine, error = fn(*args), None
    except Exception as e:
        mine, error = None, e
    values = []
    for future in futures:
        try:
            values.append(future.result())
        except Exception as e:
            error = error or e
    if error is not None:
        raise error
    return mine, values


@dataclass
class DataParallel:
    """This rank's view of the data-parallel groups.

    size: the number of groups (1: no data parallelism). index: this rank's group.
    group_size: ranks per group. world: the job's channel (`Ranks`; None with one group).
    control: this rank's group's channel (what its `Calls` go over; None with one group).
    remotes: on rank 0, a `RemoteGroup` per other group (index order); else empty.
    link: on another group's leader, its link to rank 0 (`Calls`, the leader's side).
    """

    size: int = 1
    index: int = 0
    group_size: int = 1
    world: Ranks | None = None
    control: Any = None
    remotes: list[RemoteGroup] = field(default_factory=list)
    link: Calls | None = None

    @property
    def lost(self) -> str | None:
        """Why a link to another group failed (a rank stopped), or None."""
        lost = [r.lost for r in self.remotes if r.lost]
        if self.link is not None and self.link.lost:
            lost.append(self.link.lost)
        return lost[0] if lost else None

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` of the job, in global rank order (every rank calls it)."""
        return self.world.all_gather(obj) if self.world is not None else [obj]

    def close_remotes(self) -> None:
        """Rank 0: tell every other group's leader to close (each group closes with it)."""
        for remote in self.remotes:
            remote.close()

    def close(self) -> None:
        """Leave the link and the job's process group (after `close_remotes` and the group's
        own channel). Later calls do nothing."""
        if self.link is not None:
            self.link.ranks.close()
        if self.world is not None:
            self.world.close()

    def close_all(self, calls: Calls, release: Callable[[], None]) -> None:
        """Close every group this rank reaches: rank 0 tells the other groups' leaders first
        (each closes its group), then this rank's group closes (`calls.close(release)`), then
        this rank leaves the job's process group."""
        try:
            self.close_remotes()
        finally:
            try:
                calls.close(release)
            finally:
                self.close()


def data_parallel(ranks: Ranks, size: int) -> DataParallel:
    """The groups of `size` consecutive rank ranges of the job (`ranks.world` divisible by
    `size`) and the links between rank 0 and every other group's leader: collective, every
    rank of the job calls it (each process group is made by all of them, in the same order).
    With `size` 1: one group over `ranks`, no links."""
    if size == 1:
        return DataParallel(group_size=ranks.world, control=ranks)
    n = ranks.world // size
    partition = [list(range(g * n, (g + 1) * n)) for g in range(size)]
    control = None
    for members in partition:
        control = ranks.subgroup(members, partition) or control
    remotes, link = [], None
    for g in range(1, size):
        channel = ranks.subgroup([0, g * n])
        if ranks.rank == 0:
            remotes.append(RemoteGroup(g, g * n, Calls(channel)))
        elif channel is not None:
            link = Calls(channel)
    return DataParallel(size, ranks.rank // n, n, ranks, control, remotes, link)
