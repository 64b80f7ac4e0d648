"""Tensor-parallel all-reduce (sum) between ranks whose GPUs reach each other's memory through
CUDA IPC (peer-to-peer): one kernel launch (`csrc/all_reduce.cu`), no barrier kernel, no host
work per call, so it captures into CUDA graphs and into the body of a WHILE node. NVLink
multicast is never used.

Each rank owns one symmetric buffer (cudaMalloc, exported with cudaIpcGetMemHandle, opened by
every peer with cudaIpcOpenMemHandle); byte offsets from its base (`BufferLayout`):

    data   [2 parities][world][max_ctas][sub_bytes]   slot (parity, r) holds rank r's partials
    flags  [world][MAX_CTAS] uint32 at flags_off      the last call each rank's CTA c signalled
    seq    [MAX_CTAS] uint32 at seq_off               this rank's calls per CTA (never shared)

A call's CTA c (which always works in sub-region c of a slot, whatever the grid) takes
s = seq[c] + 1 and parity s & 1, pushes its chunk of the input into slot (parity, my rank) of
EVERY rank's buffer, fences at system scope, stores flag (my rank, c) = s into every rank's
buffer (st.release.sys), spins (ld.acquire.sys) until its own buffer's flags (r, c) reach s for
every rank r, sums the world partials in rank order 0, 1, ..., world-1 in fp32, casts to the
dtype (round to nearest even) and stores seq[c] = s. Every rank therefore gets the same bits,
equal to `reference_all_reduce` of the ranks' inputs. Double buffering by parity makes reuse
safe: a rank starts call k+2 of a CTA only after every peer signalled call k+1, which each peer
does only after finishing call k, reads included (the source explains it in full). A peer that
never arrives makes the kernel trap after `timeout_s` (an error, not a hang).

Every rank must make the same calls (same sizes, same order: eager calls, graph replays and
WHILE iterations alike), since the per-CTA counters live on the device and must stay equal;
and one object's calls must run one after the other on the device (one stream, or streams
ordered by events; no programmatic dependent launch), since reuse is safe only in that order.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Sequence

import torch

from dlrt.kernels.cubin import Kernel
from dlrt.kernels.cubin import check as _check

MAX_WORLD = 8  # DLRT_AR_MAX_WORLD of csrc/all_reduce.cu
MAX_CTAS = 128  # DLRT_AR_MAX_CTAS: the flags region's CTAs per rank
THREADS = 512  # DLRT_AR_THREADS: threads per CTA (the kernel's launch bound)
VEC_BYTES = 16  # one vectorised load / store
KERNELS = {torch.bfloat16: "dlrt_all_reduce_bf16", torch.float16: "dlrt_all_reduce_fp16",
           torch.float32: "dlrt_all_reduce_fp32"}
_ARG_TYPES = ((ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong)
              + (ctypes.c_void_p,) * MAX_WORLD
              + (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
                 ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint64))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


@dataclasses.dataclass(frozen=True)
class BufferLayout:
    """Byte offsets of one rank's symmetric buffer (the same on every rank).

    `sub_bytes`: one CTA's sub-region of a slot, large enough for the chunk `launch_shape`
    gives any message of at most `capacity_bytes`; `slot_bytes` = max_ctas * sub_bytes; the
    data region is [2][world] slots; then the flags ([world][MAX_CTAS] uint32) at `flags_off`
    and the per-CTA counters ([MAX_CTAS] uint32) at `seq_off`; `total_bytes` in all.
    """

    capacity_bytes: int
    world: int
    max_ctas: int
    sub_bytes: int
    slot_bytes: int
    flags_off: int
    seq_off: int
    total_bytes: int


def buffer_layout(capacity_bytes: int, world: int, max_ctas: int) -> BufferLayout:
    """The layout for messages of up to `capacity_bytes`, `world` ranks and grids of up to
    `max_ctas` CTAs (1..MAX_CTAS). ValueError for values out of range."""
    if capacity_bytes <= 0:
        raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
    if not 2 <= world <= MAX_WORLD:
        raise ValueError(f"world must be 2..{MAX_WORLD}, got {world}")
    if not 1 <= max_ctas <= MAX_CTAS:
        raise ValueError(f"max_ctas must be 1..{MAX_CTAS}, got {max_ctas}")
    # a full grid takes ceil(vectors / max_ctas) vectors per CTA; a smaller grid at most THREADS
    vectors = _ceil_div(capacity_bytes, VEC_BYTES)
    sub_bytes = VEC_BYTES * max(THREADS, _ceil_div(vectors, max_ctas))
    slot_bytes = max_ctas * sub_bytes
    flags_off = 2 * world * slot_bytes
    seq_off = flags_off + _round_up(world * MAX_CTAS * 4, 256)
    total = seq_off + _round_up(MAX_CTAS * 4, 256)
    return BufferLayout(capacity_bytes, world, max_ctas, sub_bytes, slot_bytes, flags_off,
                        seq_off, total)


def launch_shape(numel: int, elsize: int, max_ctas: int) -> tuple[int, int]:
    """(grid, chunk) of a call on `numel` > 0 elements of `elsize` bytes: CTAs of at least
    THREADS 16-byte vectors each (one per thread) up to `max_ctas` CTAs; `chunk` elements per
    CTA, a multiple of 16 bytes, every CTA's chunk non-empty. It depends only on its arguments,
    so every rank launches the same grid for the same message."""
    per_vec = VEC_BYTES // elsize
    vectors = _ceil_div(numel, per_vec)
    grid = min(max_ctas, _ceil_div(vectors, THREADS))
    chunk = _ceil_div(vectors, grid) * per_vec
    return _ceil_div(numel, chunk), chunk


def check_input(x: torch.Tensor, device: torch.device, capacity_bytes: int) -> None:
    """ValueError naming the problem unless `x` is a contiguous bfloat16 / float16 / float32
    tensor on `device` of at most `capacity_bytes`."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"all_reduce takes a tensor, got {type(x).__name__}")
    if x.dtype not in KERNELS:
        raise ValueError(f"all_reduce takes bfloat16, float16 or float32, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"all_reduce's tensor is on {x.device}, the buffers on {device}")
    if not x.is_contiguous():
        raise ValueError(f"all_reduce takes a contiguous tensor (shape {tuple(x.shape)}, "
                         f"strides {x.stride()})")
    nbytes = x.numel() * x.element_size()
    if nbytes > capacity_bytes:
        raise ValueError(f"all_reduce's tensor has {nbytes} bytes ({tuple(x.shape)} "
                         f"{x.dtype}), more than the capacity of {capacity_bytes} bytes")


def reference_all_reduce(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """What the kernel computes from the ranks' inputs `parts` (in rank order, one shape and
    dtype): ((parts[0] + parts[1]) + ...) + parts[-1] element by element in fp32, cast to the
    parts' dtype (round to nearest even). A new tensor on the parts' device. ValueError for no
    parts or parts that differ in shape, dtype or device."""
    if len(parts) == 0:
        raise ValueError("reference_all_reduce needs at least one part")
    first = parts[0]
    for i, p in enumerate(parts):
        if p.shape != first.shape or p.dtype != first.dtype or p.device != first.device:
            raise ValueError(f"part {i} is {tuple(p.shape)} {p.dtype} on {p.device}, part 0 "
                             f"{tuple(first.shape)} {first.dtype} on {first.device}")
    acc = first.to(torch.float32, copy=True)
    for p in parts[1:]:
        acc.add_(p.to(torch.float32))
    return acc.to(first.dtype)


def _index(device) -> int:
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"{d} is not a CUDA device")
    return d.index if d.index is not None else torch.cuda.current_device()


def p2p_supported(device, world_local_devices: Sequence) -> tuple[bool, str]:
    """Whether `P2PAllReduce` can run between this rank's `device` and the local ranks'
    devices `world_local_devices` (CUDA device indices, names or torch.devices; one per rank,
    repeats allowed): every pair of distinct devices can access each other's memory
    (cudaDeviceCanAccessPeer, both ways); a device always reaches its own memory. Returns
    (True, a line naming the devices) or (False, why not). Never raises for a missing GPU or
    cuda-bindings."""
    try:
        me = _index(device)
        devices = [_index(d) for d in world_local_devices]
    except (ValueError, RuntimeError, AssertionError) as e:  # (torch without CUDA asserts)
        return False, str(e)
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return False, "cuda-bindings is not installed (pip install 'dlrt[gpu]')"
    count = torch.cuda.device_count()
    bad = [d for d in [me, *devices] if not 0 <= d < count]
    if bad:
        return False, f"cuda:{bad[0]} does not exist ({count} visible devices)"
    if me not in devices:
        return False, f"cuda:{me} is not among the local devices {sorted(set(devices))}"
    distinct = sorted(set(devices))
    for a in distinct:
        for b in distinct:
            if a != b and not _check(cudart.cudaDeviceCanAccessPeer(a, b)):
                return False, f"cuda:{a} cannot access cuda:{b}'s memory (cudaDeviceCanAccessPeer)"
    names = ", ".join(f"cuda:{d}" for d in distinct)
    return True, f"{names}: every device reaches every other's memory"


def _all_gather(group, obj) -> list:
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


class P2PAllReduce:
    """Sum of a tensor over `world` ranks (2..8), each a process with its GPU `device`, the
    GPUs reaching each other's memory through CUDA IPC (see `p2p_supported`; several ranks may
    share one GPU).

    `group`: a torch.distributed process group (gloo is enough; None: the default group) of
    exactly these ranks, used only here and in `close` (all_gather_object of the IPC handles,
    a barrier), never per call. `capacity_bytes`: the largest message. `timeout_s`: how long a
    call waits for a peer on the device before the kernel traps (the launch fails, the CUDA
    context is lost: an error instead of a hang).

    Construction is collective: every rank builds the kernels (on first use), allocates
    and zeroes its buffer, and only then exchanges its IPC handle, so no rank writes into a
    buffer before it is zeroed; each rank opens every peer's buffer, and the ranks go on
    together or raise together: a rank that cannot load the kernels, export its buffer or open
    a peer's makes every rank raise RuntimeError naming it. ValueError for a bad world, rank,
    device, capacity or timeout, or ranks that disagree on rank, world or capacity.

    Attributes: `max_ctas` (the largest grid: MAX_CTAS or the smallest GPU's SM count, so a
    call's CTAs are resident together when the GPUs are otherwise idle), `layout` (the
    buffer's `BufferLayout`).
    """

    def __init__(self, group, rank: int, world: int, device: torch.device,
                 capacity_bytes: int = 8 << 20, timeout_s: float = 10.0):
        if not 2 <= world <= MAX_WORLD:
            raise ValueError(f"P2PAllReduce needs 2..{MAX_WORLD} ranks, got world={world}")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in 0..{world - 1}")
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"P2PAllReduce runs on a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.group, self.rank, self.world, self.device = group, rank, world, device
        self.capacity_bytes = int(capacity_bytes)
        self.timeout_ns = int(timeout_s * 1e9)
        self._own: int | None = None
        self._opened: list[int] = []
        with torch.cuda.device(device):
            sms, error = 0, None
            try:
                from cuda.bindings import runtime as cudart

                self._rt = cudart
                # a current context before the module loads (torch may not have made one
                # current in this thread yet)
                _check(cudart.cudaSetDevice(device.index))
                self._kernels = {dt: Kernel("all_reduce.cu", name, "the P2P all-reduce")
                                 for dt, name in KERNELS.items()}
                sms = torch.cuda.get_device_properties(device).multi_processor_count
            except Exception as e:  # every rank learns of it (a rank left out would wait)
                error = f"rank {rank} cannot load the kernels: {e}"
            seen = _all_gather(group, (rank, world, self.capacity_bytes, sms, error))
            errors = [s[4] for s in seen if s[4] is not None]
            if errors:
                raise RuntimeError("P2PAllReduce setup failed: " + "; ".join(errors))
            if [s[:3] for s in seen] != [(r, world, self.capacity_bytes) for r in range(world)]:
                raise ValueError("the ranks disagree on (rank, world, capacity_bytes): "
                                 f"{[s[:3] for s in seen]}")
            # grids never exceed the SMs of the smallest GPU, so a call's CTAs are resident
            # together on every rank (a CTA waits for its peers' CTA of the same index)
            self.max_ctas = min(MAX_CTAS, *(s[3] for s in seen))
            self.layout = buffer_layout(self.capacity_bytes, world, self.max_ctas)
            raw = None
            try:
                self._own = int(_check(cudart.cudaMalloc(self.layout.total_bytes)))
                _check(cudart.cudaMemset(self._own, 0, self.layout.total_bytes))
                _check(cudart.cudaDeviceSynchronize())
                raw = bytes(_check(cudart.cudaIpcGetMemHandle(self._own)).reserved)
                error = None
            except RuntimeError as e:
                error = f"rank {rank} cannot export its buffer: {e}"
            # every buffer is zeroed before any rank holds a handle to it
            handles = _all_gather(group, (raw, error))
            errors = [e for _, e in handles if e is not None]
            bufs: list[int] = []
            for r, (raw, _) in enumerate(handles):
                if errors:
                    break
                if r == rank:
                    bufs.append(self._own)
                    continue
                h = cudart.cudaIpcMemHandle_t()
                h.reserved = raw
                try:
                    ptr = int(_check(cudart.cudaIpcOpenMemHandle(
                        h, cudart.cudaIpcMemLazyEnablePeerAccess)))
                except RuntimeError as e:
                    errors.append(f"rank {rank} cannot open rank {r}'s buffer: {e}")
                    break
                self._opened.append(ptr)
                bufs.append(ptr)
            # all ranks go on, or all raise (a rank left alone would wait on the device)
            errors = [e for e in _all_gather(group, errors[-1] if errors else None) if e]
            if errors:
                self._release(self._barrier)
                raise RuntimeError("P2PAllReduce setup failed: " + "; ".join(errors))
        self._bufs = tuple(bufs) + (0,) * (MAX_WORLD - world)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of `x` (contiguous bfloat16 / float16 / float32 on this
        rank's device, at most `capacity_bytes`): a new tensor of x's shape and dtype, the
        same bits on every rank, equal to `reference_all_reduce` of the ranks' inputs in rank
        order. Enqueued on the current stream (captured when a capture is running, in a CUDA
        graph or a WHILE node's body); every rank must make the same calls in the same order.
        ValueError naming the problem for a wrong dtype, device, layout or size; RuntimeError
        after `close`."""
        if self._own is None:
            raise RuntimeError("P2PAllReduce.all_reduce after close()")
        check_input(x, self.device, self.capacity_bytes)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        n = x.numel()
        if n == 0:
            return out
        grid, chunk = launch_shape(n, x.element_size(), self.max_ctas)
        lay = self.layout
        assert chunk * x.element_size() <= lay.sub_bytes
        args = (x.data_ptr(), out.data_ptr(), n, chunk, *self._bufs, self.rank, self.world,
                lay.slot_bytes, lay.sub_bytes, lay.flags_off, lay.seq_off, self.timeout_ns)
        kernel = self._kernels[x.dtype]
        if torch.cuda.current_device() == self.device.index:
            kernel.launch(grid, THREADS, args, _ARG_TYPES)
        else:
            with torch.cuda.device(self.device):
                kernel.launch(grid, THREADS, args, _ARG_TYPES)
        return out

    def _barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def _release(self, barrier: Callable[[], None],
                 errors: list[Exception] | None = None) -> None:
        """Rank by rank in rank order (each after the previous one: `barrier()` returns when
        every rank called it), close the mappings of the peers' buffers; then, once every rank
        has, free the own buffers, again in rank order: freeing an exported buffer that a peer
        still maps is undefined behaviour. Every rank passes every barrier whatever fails on
        it (a rank that stopped early would leave the others waiting on the group): a failed
        CUDA call is kept and the rank goes on; after the last barrier the first failure
        (`errors` holds those from before the release) is raised."""
        errors = [] if errors is None else errors

        def attempt(call, ptr: int) -> None:
            try:
                _check(call(ptr))
            except Exception as e:  # raised after the last barrier
                errors.append(e)

        for r in range(self.world):
            if r == self.rank:
                for ptr in self._opened:
                    attempt(self._rt.cudaIpcCloseMemHandle, ptr)
                self._opened = []
            barrier()
        for r in range(self.world):
            if r == self.rank and self._own is not None:
                attempt(self._rt.cudaFree, self._own)
                self._own = None
            barrier()
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Collective, once the device no longer runs any of this object's launches (graphs
        holding them included): waits for the device, then releases the buffers in rank order
        over the group (`_release`), also when waiting failed (that error is raised after the
        release). Later calls do nothing."""
        if self._own is None:
            return
        errors: list[Exception] = []
        with torch.cuda.device(self.device):
            try:
                torch.cuda.synchronize()
            except Exception as e:  # (a launch trapped) every rank still passes every barrier
                errors.append(e)
            self._release(self._barrier, errors)
