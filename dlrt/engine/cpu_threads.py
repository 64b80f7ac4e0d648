"""How many threads torch runs a model on the CPU with (`EngineConfig.cpu_threads`).

PyTorch's default, one intra-op thread per core, suits large matrices on an idle machine. A
small model's ops are too short to share: each one waits for every thread, so a core that
another process keeps busy stalls every op (the embedded 7.6M-weight model generated 64
tokens in 1.4 s with one thread and in 27 s with two on 2 cores, one of them busy). `auto`
therefore runs a small model on one thread, and a larger one on the cores this process may use
(its affinity, within a cgroup CPU quota) that are idle now. It keeps torch's count when
`OMP_NUM_THREADS` is set (the user's choice; torchrun sets 1), under several ranks (every rank
must compute the same bits, so they must not count cores apart) and on CUDA.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import torch

from dlrt.errors import OptionError
from dlrt.models.config import ModelConfig

log = logging.getLogger(__name__)

# NOTE: the weights of a token's forward below which ops are too short to share among threads
# (the embedded default model has 7.6M; SDAR-1.7B about 2B).
SMALL_MODEL = 50_000_000
BUSY_SAMPLE_S = 0.1  # how long the cores' load is watched


def token_weights(config: ModelConfig) -> int:
    """The weights one token's forward multiplies by: every layer's attention projections,
    its MLP (a MoE layer: the experts a token is routed to and the shared ones) and the LM
    head."""
    h = config.hidden_size
    attention = h * config.head_dim * 2 * (config.num_heads + config.num_kv_heads)
    dense = 3 * h * config.intermediate_size
    routed = 3 * h * config.moe_intermediate_size * (config.num_experts_per_tok
                                                     + config.num_shared_experts)
    moe = len(config.moe_layers) if config.num_experts else 0
    return (config.num_layers * attention + (config.num_layers - moe) * dense + moe * routed
            + config.vocab_size * h)


def usable_cores(affinity: set[int] | None = None,
                 cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> set[int]:
    """The CPUs this process may run on (`os.sched_getaffinity`), at most as many as its cgroup
    (v2) CPU quota allows (the lowest ids)."""
    if affinity is None:
        get = getattr(os, "sched_getaffinity", None)
        affinity = set(get(0)) if get else set(range(os.cpu_count() or 1))
    try:
        quota, period = cgroup.read_text().split()[:2]
        limit = math.ceil(int(quota) / int(period)) if quota != "max" else len(affinity)
    except (OSError, ValueError):
        limit = len(affinity)
    return set(sorted(affinity)[:max(limit, 1)])


def _cpu_times(stat: str) -> dict[int, tuple[int, int]]:
    """cpu id -> (busy, total) jiffies from the text of /proc/stat."""
    out = {}
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in fields]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            out[int(name[3:])] = (sum(values) - idle, sum(values))
    return out


def busy_between(before: str, after: str, cpus: set[int]) -> float:
    """How many of `cpus` were busy (0..len(cpus)) between two readings of /proc/stat."""
    t0, t1 = _cpu_times(before), _cpu_times(after)
    busy = 0.0
    for cpu in cpus:
        if cpu in t0 and cpu in t1 and t1[cpu][1] > t0[cpu][1]:
            busy += (t1[cpu][0] - t0[cpu][0]) / (t1[cpu][1] - t0[cpu][1])
    return busy


def busy_cores(cpus: set[int], seconds: float = BUSY_SAMPLE_S) -> float:
    """How many of `cpus` other processes keep busy, watched for `seconds` (0 where
    /proc/stat cannot be read)."""
    stat = Path("/proc/stat")
    try:
        before = stat.read_text()
        time.sleep(seconds)
        return busy_between(before, stat.read_text(), cpus)
    except OSError:
        return 0.0


def choose(usable: int, busy: float) -> int:
    """Threads for a large model on `usable` cores of which `busy` are busy: the idle ones (at
    least 1)."""
    return max(1, min(usable, round(usable - busy)))


def resolve_cpu_threads(option: str | int, device: torch.device, config: ModelConfig,
                        ranks: int = 1) -> int:
    """The thread count `option` ("auto", or a count >= 1, maybe as digits) means for a model
    of `config` on `device` among `ranks` ranks: a count given is kept; `auto` is torch's
    current count on CUDA, with OMP_NUM_THREADS set or several ranks, 1 for a small model, else
    `choose`'s for the cores' load now (it watches /proc/stat for `BUSY_SAMPLE_S` seconds).

    Raises:
        OptionError: a count above the cores this process may use (`usable_cores`): more
            threads than cores only wait for each other, and far more crash OpenMP.
    """
    if option != "auto":
        cores = len(usable_cores())
        if int(option) > cores:
            raise OptionError(f"cpu_threads={option!r}: this process may run on {cores} CPU "
                              f"core(s) (its affinity and CPU quota); pass at most {cores}")
        return int(option)
    if device.type != "cpu" or os.environ.get("OMP_NUM_THREADS") or ranks > 1:
        return torch.get_num_threads()
    if token_weights(config) < SMALL_MODEL:
        return 1
    cores = usable_cores()
    return choose(len(cores), busy_cores(cores))


def apply_cpu_threads(device: torch.device, threads: int) -> None:
    """torch's intra-op thread count for the whole process (`torch.set_num_threads`), on the
    CPU only; a model on CUDA leaves it as it is."""
    if device.type == "cpu" and torch.get_num_threads() != threads:
        log.info("torch CPU threads: %d (was %d)", threads, torch.get_num_threads())
        torch.set_num_threads(threads)
