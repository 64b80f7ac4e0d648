"""The P2P all-reduce (`csrc/all_reduce.cu`, `dlrt.distributed.p2p`).

CPU: the source compiled for sm_90 and sm_80 (every dtype's kernel in the cubin, no warnings,
no spills, registers for 512 threads per SM), its PTX free of NVLink multicast and holding the
protocol's system-scope release / acquire; the host's constants against the source's; the
buffer layout and launch shapes for every message size up to the capacity; the input checks;
`reference_all_reduce` (fp32 in rank order, which a bf16 sum or another order does not give);
the release of the buffers in rank order (threads as ranks, the CUDA calls recorded), every
rank passing every barrier when a CUDA call fails on one.
GPU (processes spawned here, a gloo group over a FileStore, a deadline on each run): ranks on
one GPU (2 and 3) and on distinct GPUs (when there are two or more with peer access) reduce
fresh inputs of a round's message sizes (4x2048 and 4x4096 bf16, one element, odd sizes, fp16,
an unaligned view, the full capacity), twice over, bit-identical on every rank and to the
reference; the same inside a captured CUDA graph replayed with new inputs, and inside a WHILE
node's body (5 iterations, launched twice); a peer that never calls makes the kernel trap after
the timeout instead of hanging.
"""

from __future__ import annotations

import ctypes
import datetime
import multiprocessing
import os
import re
import shutil
import subprocess
import time
import traceback
from pathlib import Path

import pytest
import torch

from dlrt.distributed import p2p
from dlrt.distributed.p2p import (
    MAX_CTAS,
    THREADS,
    P2PAllReduce,
    buffer_layout,
    check_input,
    launch_shape,
    p2p_supported,
    reference_all_reduce,
)
from dlrt.resources import csrc_path

SOURCE = csrc_path("all_reduce.cu")

# --- CPU -------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_source_compiles(tmp_path, arch):
    out = tmp_path / "all_reduce.cubin"
    proc = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v",
                           "-Werror", "all-warnings", "-o", str(out), str(SOURCE)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    for name in p2p.KERNELS.values():
        assert name.encode() in data, name
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", proc.stderr)]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert len(regs) == 3 and max(regs) * THREADS <= 65536 and not any(spills), proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_ptx_has_the_protocol_and_no_multicast(tmp_path):
    out = tmp_path / "all_reduce.ptx"
    proc = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-O3", "-o", str(out), str(SOURCE)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ptx = out.read_text()
    code = re.sub(r"//[^\n]*", "", SOURCE.read_text())  # (the comments say what is not used)
    assert "multimem" not in ptx and "multimem" not in code and "Multicast" not in code
    for kernel in re.split(r"\.entry ", ptx)[1:]:
        for op in ("st.release.sys.global.u32", "ld.acquire.sys.global.u32", "membar.sys",
                   "%globaltimer", "trap;", "ld.global.cg.v4", "st.global.cg.v4"):
            assert op in kernel, (kernel.split("(")[0], op)


def test_constants_match_the_source():
    src = SOURCE.read_text()
    defines = dict(re.findall(r"#define (DLRT_AR_\w+) (\d+)", src))
    assert {k: int(v) for k, v in defines.items()} == {
        "DLRT_AR_MAX_WORLD": p2p.MAX_WORLD, "DLRT_AR_MAX_CTAS": MAX_CTAS,
        "DLRT_AR_THREADS": THREADS}
    # the kernels' parameters against the ctypes the host launches them with
    params = re.search(r"NAME\((.*?)\) \{", src, re.S).group(1).replace("\\", " ")
    ctype = {"long long": ctypes.c_longlong, "int": ctypes.c_int,
             "unsigned long long": ctypes.c_uint64}
    want = [ctypes.c_void_p if "*" in p else ctype[p.rsplit(None, 1)[0].strip()]
            for p in (" ".join(q.split()) for q in params.split(","))]
    assert list(p2p._ARG_TYPES) == want


@pytest.mark.parametrize("capacity,world,max_ctas", [
    (8 << 20, 2, 128), (8 << 20, 8, 128), (4 << 20, 3, 108), (1000, 2, 7),
    (16, 5, 1), ((1 << 20) + 6, 4, 100)])
def test_layout_holds_every_launch(capacity, world, max_ctas):
    lay = buffer_layout(capacity, world, max_ctas)
    assert lay.sub_bytes % 16 == 0 and lay.slot_bytes == max_ctas * lay.sub_bytes
    assert lay.flags_off == 2 * world * lay.slot_bytes >= 2 * world * capacity
    assert lay.seq_off >= lay.flags_off + world * MAX_CTAS * 4 and lay.seq_off % 256 == 0
    assert lay.total_bytes >= lay.seq_off + MAX_CTAS * 4
    for elsize in (2, 4):
        most = capacity // elsize
        sizes = {1, 2, 7, 8, 9, 4095, 4096, 4097, most, most - 1, most // 3, most // 7 + 5}
        sizes |= set(torch.randint(1, most + 1, (200,),
                                   generator=torch.Generator().manual_seed(most)).tolist())
        for n in sorted(s for s in sizes if 1 <= s <= most):
            grid, chunk = launch_shape(n, elsize, max_ctas)
            assert 1 <= grid <= max_ctas and chunk * elsize % 16 == 0, (n, elsize)
            assert (grid - 1) * chunk < n <= grid * chunk, (n, elsize)  # no empty CTA
            assert chunk * elsize <= lay.sub_bytes, (n, elsize)


def test_launch_shapes_of_a_round():
    assert launch_shape(4 * 2048, 2, 128) == (2, 4096)
    assert launch_shape(4 * 4096, 2, 128) == (4, 4096)
    assert launch_shape(1, 2, 128) == (1, 8)
    assert launch_shape(4 * 4095, 4, 128) == (8, 2048)
    assert launch_shape(1 << 22, 2, 128) == (128, 1 << 15)  # 8 MiB bf16: every CTA busy


def test_layout_refuses_bad_values():
    with pytest.raises(ValueError, match="world must be 2..8"):
        buffer_layout(1024, 9, 4)
    with pytest.raises(ValueError, match="max_ctas"):
        buffer_layout(1024, 2, MAX_CTAS + 1)
    with pytest.raises(ValueError, match="capacity_bytes"):
        buffer_layout(0, 2, 4)


def test_input_checks_name_the_problem():
    cpu = torch.device("cpu")
    check_input(torch.zeros(4, 8, dtype=torch.bfloat16), cpu, 64)
    with pytest.raises(ValueError, match="bfloat16, float16 or float32, got torch.int32"):
        check_input(torch.zeros(4, dtype=torch.int32), cpu, 64)
    with pytest.raises(ValueError, match="is on cpu, the buffers on cuda:1"):
        check_input(torch.zeros(4), torch.device("cuda", 1), 64)
    with pytest.raises(ValueError, match="contiguous"):
        check_input(torch.zeros(4, 8).t(), cpu, 1024)
    with pytest.raises(ValueError, match="132 bytes .* more than the capacity of 128"):
        check_input(torch.zeros(33), cpu, 128)
    with pytest.raises(ValueError, match="takes a tensor"):
        check_input([1.0], cpu, 128)


def test_construction_refuses_bad_arguments_before_any_cuda():
    with pytest.raises(ValueError, match="2..8 ranks"):
        P2PAllReduce(None, 0, 1, torch.device("cuda", 0))
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        P2PAllReduce(None, 2, 2, torch.device("cuda", 0))
    with pytest.raises(ValueError, match="CUDA device, got cpu"):
        P2PAllReduce(None, 0, 2, torch.device("cpu"))


def _parts(seed: int, world: int, shape, dtype) -> list[torch.Tensor]:
    """One input per rank, on the CPU, of mixed magnitudes (so the order of the sum shows)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(world):
        scale = 10.0 ** torch.randint(-3, 4, shape, generator=gen)
        out.append((torch.randn(shape, generator=gen) * scale).to(dtype))
    return out


def test_reference_sums_in_fp32_in_rank_order():
    parts = _parts(0, 4, (4, 4095), torch.bfloat16)
    kept = [p.clone() for p in parts]
    got = reference_all_reduce(parts)
    want = ((parts[0].float() + parts[1].float()) + parts[2].float()) + parts[3].float()
    assert got.dtype == torch.bfloat16 and got.shape == (4, 4095)
    assert torch.equal(got.view(torch.int16), want.bfloat16().view(torch.int16))
    assert all(torch.equal(a, b) for a, b in zip(parts, kept, strict=True))  # inputs untouched
    # bit-identical whoever calls it (a copy of the inputs, another call)
    again = reference_all_reduce([p.clone() for p in parts])
    assert torch.equal(got.view(torch.int16), again.view(torch.int16))
    # not what a bf16 sum gives
    in_bf16 = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    assert not torch.equal(got, in_bf16)
    # in fp32 the order matters: the reverse order differs somewhere
    fp = _parts(1, 4, (4, 4095), torch.float32)
    forward = reference_all_reduce(fp)
    assert torch.equal(forward, ((fp[0] + fp[1]) + fp[2]) + fp[3])
    assert not torch.equal(forward, ((fp[3] + fp[2]) + fp[1]) + fp[0])
    half = _parts(2, 3, (13,), torch.float16)
    assert torch.equal(reference_all_reduce(half),
                       ((half[0].float() + half[1].float()) + half[2].float()).half())


def test_reference_of_one_part_is_a_copy_and_bad_parts_are_named():
    x = torch.randn(5)
    y = reference_all_reduce([x])
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()
    with pytest.raises(ValueError, match="at least one part"):
        reference_all_reduce([])
    with pytest.raises(ValueError, match="part 1 is"):
        reference_all_reduce([torch.zeros(3), torch.zeros(4)])
    with pytest.raises(ValueError, match="part 1 is"):
        reference_all_reduce([torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_p2p_supported_without_a_gpu():
    assert p2p_supported(0, [0, 0]) == (False, "CUDA is not available")
    ok, why = p2p_supported("cpu", [0])
    assert not ok and "not a CUDA device" in why


class _RecordedRuntime:
    """The two CUDA calls of a release, appended to a shared list; a call on a pointer in
    `fail` returns a CUDA error."""

    def __init__(self, rank: int, events: list, fail: tuple = ()):
        self.rank, self.events, self.fail = rank, events, fail

    def _call(self, what: str, ptr):
        self.events.append((self.rank, what, ptr))
        return (1,) if ptr in self.fail else (0,)  # cudaErrorInvalidValue

    def cudaIpcCloseMemHandle(self, ptr):  # noqa: N802 - the CUDA name
        return self._call("unmap", ptr)

    def cudaFree(self, ptr):  # noqa: N802
        return self._call("free", ptr)


def _ranks(world: int, events: list, fail: tuple = ()) -> list[P2PAllReduce]:
    """`world` all-reduces of threads as ranks: rank r owns buffer 100 + r and maps 200 + p
    for each peer p (the CUDA calls recorded; rank r's calls on the pointers (r, ptr) in `fail`
    fail)."""
    ranks = []
    for r in range(world):
        ar = P2PAllReduce.__new__(P2PAllReduce)
        ar.rank, ar.world = r, world
        ar._rt = _RecordedRuntime(r, events, [p for q, p in fail if q == r])
        ar._own, ar._opened = 100 + r, [200 + p for p in range(world) if p != r]
        ar.device = torch.device("cpu")
        ranks.append(ar)
    return ranks


def _on_threads(ranks: list, work) -> list:
    """work(rank's all-reduce) on a thread per rank: each one's result or exception."""
    import threading

    out: list = [None] * len(ranks)

    def one(ar):
        try:
            out[ar.rank] = work(ar)
        except BaseException as e:  # noqa: BLE001 - returned for the test to check
            out[ar.rank] = e

    threads = [threading.Thread(target=one, args=(ar,)) for ar in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return out


def _in_rank_order(world: int) -> list:
    return ([(r, "unmap", 200 + p) for r in range(world) for p in range(world) if p != r]
            + [(r, "free", 100 + r) for r in range(world)])


@pytest.mark.parametrize("world", [2, 3])
def test_buffers_are_released_in_rank_order(world, monkeypatch):
    """Rank by rank, each after the previous one, the peers' buffers are unmapped; only then,
    again rank by rank, each rank frees its own (a peer never maps a freed buffer); a second
    close does nothing (no CUDA call, no barrier)."""
    import threading

    events: list = []
    gate = threading.Barrier(world, timeout=30)
    ranks = _ranks(world, events)

    def release(ar):
        time.sleep(0.01 * (world - ar.rank))  # the later ranks would go first, unordered
        ar._release(gate.wait)

    assert _on_threads(ranks, release) == [None] * world
    assert events == _in_rank_order(world)
    assert all(ar._own is None and ar._opened == [] for ar in ranks)

    def no_barrier():
        raise AssertionError("a second close met a barrier")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: pytest.fail("synchronized"))
    for ar in ranks:
        ar._barrier = no_barrier
        ar.close()
    assert events == _in_rank_order(world)


@pytest.mark.parametrize("ptr", [200, 101])  # rank 1 cannot unmap rank 0's buffer / free its own
def test_a_failed_release_step_passes_every_barrier_and_raises_after(ptr):
    """A CUDA call that fails on one rank does not leave the others waiting at a barrier:
    every rank passes every barrier and makes its other calls, the failing rank raises its
    error after the last barrier, the others return."""
    import threading

    world, events = 3, []
    gate = threading.Barrier(world, timeout=5)
    ranks = _ranks(world, events, fail=[(1, ptr)])
    out = _on_threads(ranks, lambda ar: ar._release(gate.wait))
    assert out[0] is None and out[2] is None, out
    assert isinstance(out[1], RuntimeError), out[1]
    assert events == _in_rank_order(world)
    assert all(ar._own is None and ar._opened == [] for ar in ranks)


def test_close_releases_on_every_rank_when_waiting_for_the_device_fails(monkeypatch):
    """A rank whose device fails (a trapped launch) still passes every barrier of the release,
    then raises that error; the other ranks close."""
    import contextlib
    import threading

    world, events = 2, []
    gate = threading.Barrier(world, timeout=5)
    ranks = _ranks(world, events)

    def synchronize():
        if threading.current_thread().name == "rank 1":
            raise RuntimeError("CUDA error: an illegal instruction was encountered")

    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)

    def close(ar):
        threading.current_thread().name = f"rank {ar.rank}"
        ar._barrier = gate.wait
        ar.close()

    out = _on_threads(ranks, close)
    assert out[0] is None and isinstance(out[1], RuntimeError), out
    assert "illegal instruction" in str(out[1])
    assert events == _in_rank_order(world)


# --- GPU -------------------------------------------------------------------------------------

CAPACITY = 4 << 20
ROUND_CASES = [((4, 2048), torch.bfloat16), ((4, 4096), torch.bfloat16), ((1,), torch.bfloat16),
               ((4, 4095), torch.float32), ((4, 4095), torch.bfloat16), ((13,), torch.float16),
               ((3, 5, 7), torch.float16), ((4, 4096), torch.float16),
               ((CAPACITY // 4,), torch.float32), ((1000, 7), torch.bfloat16)]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32 if x.element_size() == 4 else torch.int16)


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    bad = (_bits(got) != _bits(want)).sum().item()
    assert bad == 0, f"{what}: {bad} elements differ"


def _eager(ar: P2PAllReduce, rank: int, world: int) -> list[torch.Tensor]:
    dev = ar.device
    results = []
    for rnd in range(2):  # twice over: both parities, grids of every size in turn
        for i, (shape, dtype) in enumerate(ROUND_CASES):
            parts = _parts(1000 * rnd + i, world, shape, dtype)
            x = parts[rank].to(dev)
            y = ar.all_reduce(x)
            assert y.shape == x.shape and y.dtype == dtype and y.data_ptr() != x.data_ptr()
            _assert_same_bits(y.cpu(), reference_all_reduce(parts), (rnd, shape, dtype))
            results.append(y.cpu())
        # a view whose data is not 16-byte aligned (the scalar path)
        parts = _parts(500 + rnd, world, (4, 4096), torch.bfloat16)
        base = torch.empty(4 * 4096 + 1, dtype=torch.bfloat16, device=dev)
        x = base[1:].view(4, 4096)
        x.copy_(parts[rank])
        y = ar.all_reduce(x)
        _assert_same_bits(y.cpu(), reference_all_reduce(parts), (rnd, "unaligned"))
        results.append(y.cpu())
    with pytest.raises(ValueError, match="more than the capacity"):
        ar.all_reduce(torch.zeros(CAPACITY // 4 + 1, device=dev))
    with pytest.raises(ValueError, match="int64"):
        ar.all_reduce(torch.zeros(4, dtype=torch.int64, device=dev))
    return results


def _graph(ar: P2PAllReduce, rank: int, world: int) -> list[torch.Tensor]:
    dev = ar.device
    xa = torch.zeros(4, 4096, dtype=torch.bfloat16, device=dev)
    xb = torch.zeros(4, 4095, dtype=torch.float32, device=dev)
    stream = torch.cuda.Stream(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        ya = ar.all_reduce(xa)
        yb = ar.all_reduce(xb)
    results = []
    for rep in range(3):
        pa = _parts(100 + rep, world, (4, 4096), torch.bfloat16)
        pb = _parts(200 + rep, world, (4, 4095), torch.float32)
        xa.copy_(pa[rank])
        xb.copy_(pb[rank])
        graph.replay()
        torch.cuda.synchronize()
        _assert_same_bits(ya.cpu(), reference_all_reduce(pa), ("replay", rep, "bf16"))
        _assert_same_bits(yb.cpu(), reference_all_reduce(pb), ("replay", rep, "fp32"))
        results += [ya.cpu(), yb.cpu()]
    # eager calls after the replays: the counters on the device stayed in step
    parts = _parts(300, world, (4, 4096), torch.bfloat16)
    y = ar.all_reduce(parts[rank].to(dev))
    _assert_same_bits(y.cpu(), reference_all_reduce(parts), "eager after replays")
    return results + [y.cpu()]


def _while(ar: P2PAllReduce, rank: int, world: int) -> list[torch.Tensor]:
    from dlrt.runtime.graphs import WhileGraph

    dev, iters, shape = ar.device, 5, (4, 2048)
    inputs = torch.zeros(iters, *shape, dtype=torch.bfloat16, device=dev)
    hist = torch.zeros_like(inputs)
    it = torch.zeros(1, dtype=torch.int64, device=dev)
    flag = torch.ones(1, dtype=torch.int32, device=dev)

    def begin():
        it.zero_()
        flag.fill_(1)

    def body():
        x = inputs.index_select(0, it).view(shape)
        hist.index_copy_(0, it, ar.all_reduce(x).unsqueeze(0))
        it.add_(1)
        flag.copy_((it < iters).int())

    stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(stream):
        wg = WhileGraph(begin, body, lambda: None, flag)
    results = []
    for launch in range(2):
        parts = [_parts(400 + 10 * launch + k, world, shape, torch.bfloat16)
                 for k in range(iters)]
        inputs.copy_(torch.stack([p[rank] for p in parts]))
        with torch.cuda.stream(stream):
            wg.launch()
        torch.cuda.synchronize()
        assert int(it) == iters
        for k in range(iters):
            _assert_same_bits(hist[k].cpu(), reference_all_reduce(parts[k]),
                              ("while", launch, k))
        results.append(hist.cpu())
    wg.close()
    return results


def _timeout(ar: P2PAllReduce, rank: int, world: int):
    """Rank 0 calls, rank 1 never does: rank 0's kernel traps after the timeout."""
    import torch.distributed as dist

    out = None
    if rank == 0:
        x = torch.ones(4, 4096, dtype=torch.bfloat16, device=ar.device)
        start = time.monotonic()
        ar.all_reduce(x)
        try:
            torch.cuda.synchronize()
            out = {"trapped": False}
        except RuntimeError as e:
            out = {"trapped": True, "error": str(e), "seconds": time.monotonic() - start}
    dist.barrier()  # rank 1 keeps its buffer until rank 0 is done with it
    return out


SCENARIOS = {"eager": _eager, "graph": _graph, "while": _while, "timeout": _timeout}


def _worker(rank: int, world: int, devices: list[int], store: str, out_dir: str,
            scenario: str, timeout_s: float) -> None:
    out = Path(out_dir)
    try:
        import torch.distributed as dist

        torch.cuda.set_device(devices[rank])
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=120))
        ar = P2PAllReduce(dist.group.WORLD, rank, world, torch.device("cuda", devices[rank]),
                          capacity_bytes=CAPACITY, timeout_s=timeout_s)
        result = SCENARIOS[scenario](ar, rank, world)
        if scenario == "timeout":  # rank 0's CUDA context is lost: no clean-up
            torch.save(result, out / f"rank{rank}.pt")
            os._exit(0)
        torch.cuda.synchronize()
        ar.close()
        torch.save(result, out / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise SystemExit(1) from None


def _run(tmp_path, devices: list[int], scenario: str, timeout_s: float = 10.0,
         deadline_s: float = 300.0) -> list:
    """Each rank's result of `scenario`, run by len(devices) spawned processes; fails (after
    killing them) on an error or past the deadline."""
    world = len(devices)
    tmp_path.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, devices, str(tmp_path / "store"),
                                               str(tmp_path), scenario, timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join(10)
    errors = "\n".join(f.read_text() for f in sorted(tmp_path.glob("rank*.err")))
    assert not hung, f"ranks {hung} still running after {deadline_s} s\n{errors}"
    assert all(p.exitcode == 0 for p in procs), errors or [p.exitcode for p in procs]
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _assert_ranks_agree(results: list) -> None:
    for r, other in enumerate(results[1:], 1):
        assert len(other) == len(results[0])
        for i, (a, b) in enumerate(zip(results[0], other, strict=True)):
            _assert_same_bits(b, a, ("rank", r, "result", i))


def _spread_devices() -> list[int]:
    devices = list(range(min(torch.cuda.device_count(), p2p.MAX_WORLD)))
    if len(devices) < 2:
        pytest.skip("needs two GPUs")
    ok, why = p2p_supported(0, devices)
    if not ok:
        pytest.skip(why)
    return devices


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_on_one_gpu_gpu(tmp_path, world):
    assert p2p_supported(0, [0] * world)[0]
    _assert_ranks_agree(_run(tmp_path, [0] * world, "eager"))


@pytest.mark.gpu
def test_ranks_on_distinct_gpus_gpu(tmp_path):
    _assert_ranks_agree(_run(tmp_path, _spread_devices(), "eager"))


@pytest.mark.gpu
def test_graph_replays_gpu(tmp_path):
    _assert_ranks_agree(_run(tmp_path, [0, 0], "graph"))


@pytest.mark.gpu
def test_while_node_body_gpu(tmp_path):
    _assert_ranks_agree(_run(tmp_path, [0, 0], "while"))


@pytest.mark.gpu
def test_graph_and_while_on_distinct_gpus_gpu(tmp_path):
    devices = _spread_devices()
    _assert_ranks_agree(_run(tmp_path / "graph", devices, "graph"))
    _assert_ranks_agree(_run(tmp_path / "while", devices, "while"))


@pytest.mark.gpu
def test_a_missing_peer_traps_instead_of_hanging_gpu(tmp_path):
    first, _ = _run(tmp_path, [0, 0], "timeout", timeout_s=1.0, deadline_s=120.0)
    assert first["trapped"], first
    assert 0.9 < first["seconds"] < 60, first
