"""The persistent round kernel (`csrc/persistent_round.cu`, `dlrt.runtime.persistent.kernel`).

CPU: the plan's encoding read back task by task, the shapes the kernel refuses, the CUDA
source compiled for sm_90 and sm_80 when nvcc is installed, the host's `Params` layout against
the source's, and the weight page ring's shared-memory layout.
GPU: the kernel against the layer-by-layer forward on the reference ops, fp32 (tiny configs
with awkward sizes, block-causal and full attention, shuffled pages: relative error of the
logits < 1e-5, of the block's K/V < 1e-6) and bf16 at SDAR-1.7B's and SDAR-8B's sizes against
the plan run in PyTorch with the same roundings (relative error below max(2e-2, twice the
layer path's own error against that run); each row's top token within that error of the
reference's top logit; no host sync in the round); contexts 0, 1, 4095 and 32000 (8B: 0 and
4095); the page ring bit-identical to weights read from global memory; replayed from a CUDA
graph (also at another context, read from the lens buffer) and inside the block graph's WHILE
node, bit-identical to the eager launch, with the counters back at zero after every round.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import re
import shutil
import subprocess

import pytest
import torch

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.sdpa import SDPABackend
from dlrt.checkpoint.presets import preset
from dlrt.kernels.compiler import missing_compiler
from dlrt.models.sdar.config import sdar_config
from dlrt.models.sdar.model import SDARForCausalLM
from dlrt.ops import get_ops
from dlrt.resources import csrc_path, data_path
from dlrt.runtime.persistent.interpret import run_plan
from dlrt.runtime.persistent.kernel import KINDS, check_supported, encode
from dlrt.runtime.persistent.plan import build_plan
from dlrt.runtime.runner import ModelRunner

AWKWARD = dict(hidden_size=80, intermediate_size=72, num_attention_heads=6,
               num_key_value_heads=2, head_dim=32, vocab_size=1000, mask_token_id=999,
               bos_token_id=998, eos_token_id=998, num_hidden_layers=3)


def tiny(**over):
    hf = preset("tiny-sdar")[0]
    hf.update(over)
    return sdar_config(hf, "sdar")


def test_encoding_reads_back():
    plan = build_plan(tiny(**AWKWARD), 4, 5, 3)
    enc = encode(plan, "cpu")
    names = enc["weights"]
    kinds = {v: k for k, v in KINDS.items()}
    for t in plan.tasks:
        row = enc["task"][t.id].tolist()
        assert kinds[row[0]] == t.kind and row[1:6] == [t.layer, t.lo, t.hi, t.head, t.split]
        assert (names[row[6]] if row[6] >= 0 else None) == t.weight
        assert row[7] == (t.then[0] if t.then else -1)
        w0, w1 = enc["wait_off"][t.id:t.id + 2].tolist()
        assert [tuple(w) for w in enc["waits"][w0:w1].tolist()] == list(t.waits)
        s0, s1 = enc["sig_off"][t.id:t.id + 2].tolist()
        assert tuple(enc["sigs"][s0:s1].tolist()) == t.signals
    off = enc["queue_off"].tolist()
    assert [enc["queue"][a:b].tolist() for a, b in zip(off, off[1:], strict=False)] == \
        plan.queues
    # the kernel runs one `then`: the merge after a head's last attention split
    o = next(i for i, t in enumerate(plan.tasks) if t.kind == "o")
    bad = dataclasses.replace(plan, tasks=[dataclasses.replace(t, then=(0,)) if t.id == o else t
                                           for t in plan.tasks])
    with pytest.raises(ValueError, match="merges after the last"):
        encode(bad, "cpu")


def test_unsupported_shapes_are_named():
    with pytest.raises(ValueError, match="head_dim 16"):
        check_supported(build_plan(tiny(), 4, 2), torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="block 17"):
        check_supported(build_plan(tiny(**AWKWARD), 17, 2), torch.float32,
                        torch.device("cpu"))
    with pytest.raises(ValueError, match="hidden_size 84"):
        check_supported(build_plan(tiny(**dict(AWKWARD, hidden_size=84)), 4, 2),
                        torch.bfloat16, torch.device("cpu"))
    check_supported(build_plan(tiny(**AWKWARD), 4, 2), torch.float32, torch.device("cpu"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["sm_90"])
def test_source_compiles(tmp_path, arch):
    """No warnings, no local-memory spills, and the static shared memory ptxas reports within
    what the host reserves beside the dynamic part (STATIC_SHARED), for all six kernels
    (bf16 / fp32, block rows up to 4, 8, 16), on Hopper (sm_80 builds: test_csrc_build)."""
    from dlrt.runtime.persistent.kernel import STATIC_SHARED

    out = tmp_path / "round.cubin"
    proc = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v",
                           "-Werror", "all-warnings", "-o", str(out),
                           str(csrc_path("persistent_round.cu"))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", proc.stderr)]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert len(smem) == 6 and max(smem) <= STATIC_SHARED and not any(spills), proc.stderr


def test_one_kernel_builds_by_its_id():
    """Each `#if ... DLRT_ROUND_ONLY == n` of the source guards the kernel `kernel_id` gives n."""
    from dlrt.runtime.persistent.kernel import KERNEL_NAMES, kernel_id

    src = csrc_path("persistent_round.cu").read_text()
    found = re.findall(r"DLRT_ROUND_ONLY == (\d)\nDLRT_ROUND_KERNEL\((\w+),", src)
    assert [(int(n), name) for n, name in found] == [(kernel_id(k), k) for k in KERNEL_NAMES]


@pytest.mark.slow
@pytest.mark.skipif(missing_compiler() is not None, reason="needs NVRTC or nvcc")
def test_build_of_one_kernel(tmp_path, monkeypatch):
    """`build_cubin` with DLRT_ROUND_ONLY compiles that kernel alone, cached apart from the
    full build (the defines are part of the cache key)."""
    from dlrt.kernels.cubin import build_cubin
    from dlrt.runtime.persistent.kernel import kernel_id

    monkeypatch.setenv("DLRT_CACHE_DIR", str(tmp_path))
    name = "dlrt_persistent_round_bf16_b8"
    one = build_cubin("persistent_round.cu", "sm_90", "test",
                      defines={"DLRT_ROUND_ONLY": str(kernel_id(name))})
    data = one.read_bytes()
    assert name.encode() in data and b"dlrt_persistent_round_bf16_b4" not in data
    other = build_cubin("persistent_round.cu", "sm_90", "test", defines={"DLRT_ROUND_ONLY": "1"})
    assert other != one and b"dlrt_persistent_round_bf16_b4" in other.read_bytes()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_params_layout_matches_the_source(tmp_path):
    """`_Params` (ctypes) against the CUDA `Params`: every field's offset and the size, from a
    host program compiled with the kernel source (runs without a GPU)."""
    from dlrt.runtime.persistent.kernel import _Params

    names = [n for n, _ in _Params._fields_]
    main = tmp_path / "layout.cu"
    main.write_text(f'#include "{csrc_path("persistent_round.cu")}"\n#include <cstddef>\n'
                    "int main() {\n" + "".join(
                        f'  printf("%zu\\n", offsetof(Params, {n}));\n' for n in names)
                    + '  printf("%zu\\n", sizeof(Params));\n}\n')
    exe = tmp_path / "layout"
    # PTX only, unoptimised: the host side is all this needs (seconds instead of a minute)
    proc = subprocess.run(["nvcc", "-gencode", "arch=compute_90,code=compute_90", "-Xcicc",
                           "-O0", "-o", str(exe), str(main)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert got == [getattr(_Params, n).offset for n in names] + [ctypes.sizeof(_Params)]


def test_a_device_that_cannot_hold_every_cta_is_refused_by_name():
    """The CTAs wait on each other: every one must be resident at once, else the launch is
    refused before it could spin (here with what the occupancy query would answer)."""
    from dlrt.errors import OptionError
    from dlrt.runtime.persistent.kernel import check_resident

    check_resident("NVIDIA H100", 132, 1, 132, 200_000)
    check_resident("NVIDIA H100", 66, 2, 132, 100_000)  # two per SM of half the SMs
    with pytest.raises(OptionError, match=r"NVIDIA H100 \(132 SMs\) fits 0 per SM with "
                                          r"240000 bytes .*round_kernel='layers'"):
        check_resident("NVIDIA H100", 132, 0, 132, 240_000)
    with pytest.raises(OptionError, match=r"needs its 132 CTAs .* 114 in all"):
        check_resident("NVIDIA H100 (114 SMs usable)", 114, 1, 132, 200_000)


def test_ring_layout():
    from dlrt.runtime.persistent.kernel import (
        MAX_PAGES,
        PAGE_BYTES,
        STATIC_SHARED,
        ring_layout,
        shared_bytes,
    )

    plan = build_plan(_real("SDAR-8B-Chat"), 4, 132, 16)
    base = shared_bytes(plan, 2)
    limit = 227 * 1024
    pages, offset, total = ring_layout(plan, 2, 6, limit, (9, 0))
    assert offset % 128 == 0 and base <= offset < base + 128
    assert 0 < pages <= MAX_PAGES and total == offset + pages * PAGE_BYTES
    assert total + STATIC_SHARED <= limit < total + STATIC_SHARED + PAGE_BYTES or \
        pages == MAX_PAGES
    assert ring_layout(plan, 2, 2, limit, (9, 0))[0] == 2  # as asked, when they fit
    assert ring_layout(plan, 2, 6, limit, (8, 0)) == (0, offset, base)  # no bulk copies
    assert ring_layout(plan, 2, 0, limit, (9, 0)) == (0, offset, base)


# --- GPU -------------------------------------------------------------------------------------


def _model(config, dtype, seed, std=0.08):
    """Random weights in `dtype` on CUDA; buffers (RoPE's inv_freq) moved, kept fp32, as the
    loader keeps them."""
    torch.manual_seed(seed)
    model = SDARForCausalLM(config, get_ops("reference")).to("cuda")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = (torch.randn_like(p) * (0.3 if "norm" in name else std) +
                      (1.0 if "norm" in name else 0.0)).to(dtype)
    return model.eval()


def _setup(config, dtype, block, context, seed=0, caches=2, std=0.08, shuffle=False):
    """Model, caches (the prompt's K/V written by the layer path; with `shuffle`, pages in a
    random order), the layer-path runner on the first cache, the block's tokens and lens."""
    model = _model(config, dtype, seed, std)
    made = [PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim,
                         context + 64, dtype, "cuda") for _ in range(caches)]
    if shuffle:
        perm = torch.randperm(made[0].num_pages, generator=torch.Generator().manual_seed(seed))
        for c in made:
            c.page_table.copy_(perm.to(torch.int32))
    runner = ModelRunner(model, get_ops("reference"), SDPABackend(made[0], config.num_heads),
                         made[0], torch.device("cuda"))
    gen = torch.Generator().manual_seed(seed)
    for s in range(0, context, 4096):  # the prompt through the layer path, 4096 at a time
        chunk = torch.randint(0, config.vocab_size, (min(4096, context - s),), generator=gen)
        runner.forward_at(chunk.cuda(), s, block, rows=None)
    for c in made[1:]:
        c.k.copy_(made[0].k)
        c.v.copy_(made[0].v)
    tokens = torch.randint(0, config.vocab_size, (block,), generator=gen).cuda()
    lens = torch.tensor([context, context + block], dtype=torch.int32, device="cuda")
    return model, made, runner, tokens, lens


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _block_kv(cache, lens):
    """The block's K and V as the cache holds them: [L, B, Hkv, D] each."""
    start, end = (int(x) for x in lens.tolist())
    slots = cache.slots(torch.arange(start, end, device="cuda"))
    return [x.view(x.shape[0], -1, *x.shape[-2:])[:, slots] for x in (cache.k, cache.v)]


@pytest.mark.gpu
@pytest.mark.parametrize("over,block,context,splits,chunk", [
    (AWKWARD, 4, 0, 2, 4), (AWKWARD, 4, 1, 3, 4), (AWKWARD, 5, 37, 8, 5),
    (dict(AWKWARD, head_dim=64), 3, 13, 1, 3), (AWKWARD, 8, 21, 4, 4),  # two blocks (folded)
    (AWKWARD, 4, 30, 2, None),  # full attention inside the chunk
    (AWKWARD, 12, 7, 3, 12)])  # the kernel for up to 16 block rows
def test_fp32_equals_layer_path_gpu(over, block, context, splits, chunk):
    from dlrt.runtime.persistent.kernel import PersistentRound

    config = tiny(**over)
    model, (c_ref, c_k), runner, tokens, lens = _setup(config, torch.float32, block, context,
                                                       shuffle=context > 20)
    want = runner.forward(tokens, lens, chunk, rows=slice(None))
    plan = build_plan(config, block, workers=7, splits=splits)
    got = PersistentRound(plan, model, c_k, lens, chunk).forward(tokens)
    torch.cuda.synchronize()
    assert _rel(got, want) < 1e-5
    for a, b in zip(_block_kv(c_k, lens), _block_kv(c_ref, lens), strict=True):
        assert _rel(a, b) < 1e-6


def _real(name):
    hf = json.loads((data_path("configs") / name / "config.json").read_text())
    return sdar_config(hf, hf["model_type"])


@pytest.mark.gpu
@pytest.mark.parametrize("name,context", [("SDAR-1.7B-Chat", 0), ("SDAR-1.7B-Chat", 4095),
                                          ("SDAR-1.7B-Chat", 32000), ("SDAR-8B-Chat", 0),
                                          ("SDAR-8B-Chat", 4095)])
def test_bf16_real_configs_against_the_plan_run_gpu(name, context):
    from dlrt.runtime.persistent.kernel import PersistentRound

    config = _real(name)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    model, (c_a, c_b), runner, tokens, lens = _setup(config, torch.bfloat16, 4, context,
                                                     std=0.02)
    plan = build_plan(config, 4, workers=sms, splits=16)
    layers = runner.forward(tokens, lens, 4, rows=slice(None)).clone()
    want = run_plan(plan, model, c_a, tokens, lens, 4)
    rnd = PersistentRound(plan, model, c_b, lens, 4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a round never waits for the host
    try:
        got = rnd.forward(tokens)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    # bf16 through 28-36 random layers: any change of fp32 summation order moves the logits by a
    # few percent. The kernel may differ from the plan run by no more than the layer path does
    # (twice that, or 2e-2), and each row's top token is a top token of the reference up to
    # that error (a near tie may pick the other one)
    err, err_layers = _rel(got, want), _rel(layers, want)
    print(f"context {context}: kernel vs plan run {err:.4f}, layers vs plan run "
          f"{err_layers:.4f}")
    tol = max(2e-2, 2 * err_layers)
    assert err < tol
    w = want.float()
    top = w.gather(1, got.argmax(-1, keepdim=True))[:, 0]
    assert (top >= w.amax(-1) - tol * w.abs().amax(-1)).all()
    for a, b in zip(_block_kv(c_b, lens), _block_kv(c_a, lens), strict=True):
        assert _rel(a, b) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("name,over,dtype,block,context", [
    (None, AWKWARD, torch.float32, 4, 9), (None, AWKWARD, torch.float32, 12, 30),
    (None, dict(AWKWARD, hidden_size=1040, intermediate_size=2064), torch.float32, 5, 3),
    ("SDAR-1.7B-Chat", None, torch.bfloat16, 4, 4095)])
def test_page_ring_equals_global_reads_gpu(monkeypatch, name, over, dtype, block, context):
    """Weights through the shared-memory page ring (1 page: every page refilled as soon as it
    is used; 3 pages) give bit-identical logits and K/V to weights read from global memory:
    each lane sums the same 16-byte pieces in the same order either way. The third config's
    K (1040 / 2064 fp32) spans three and five K slices of a page, the last one partial."""
    from dlrt.runtime.persistent.kernel import PersistentRound

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the page ring needs sm_90")
    config = _real(name) if name else tiny(**over)
    model, caches, _, tokens, lens = _setup(config, dtype, block, context, caches=3,
                                            std=0.02 if name else 0.08)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = build_plan(config, block, workers=sms if name else 7, splits=4)
    out = []
    for pages, cache in zip((0, 1, 3), caches, strict=True):
        monkeypatch.setenv("DLRT_PERSISTENT_PAGES", str(pages))
        rnd = PersistentRound(plan, model, cache, lens, block)
        assert rnd.pages == pages
        out.append(rnd.forward(tokens).clone())
        torch.cuda.synchronize()
    assert torch.equal(out[1], out[0]) and torch.equal(out[2], out[0])
    for c in caches[1:]:
        for a, b in zip(_block_kv(c, lens), _block_kv(caches[0], lens), strict=True):
            assert torch.equal(a, b)


# (hidden, intermediate, heads, kv heads, head_dim): parts off 128 rows, so qkv and gate_up keep
# a scale row per weight row, o / down in 128-row blocks, K = 400 ending in a partial column
# block; then every part a multiple of 128 (all in blocks, as real models: gate_up's up rows
# at scale row (I + r) / 128) with down's K = 2176 over two page slices
FP8_ROWS = (256, 400, 4, 2, 32)
FP8_BLOCKS = (256, 2176, 4, 2, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes,dtype,block,context", [
    (FP8_ROWS, torch.float32, 4, 9), (FP8_ROWS, torch.float32, 5, 40),
    (FP8_ROWS, torch.bfloat16, 4, 300), (FP8_BLOCKS, torch.float32, 5, 17),
    (FP8_BLOCKS, torch.bfloat16, 8, 100)])
def test_fp8_weights_against_the_plan_run_gpu(tmp_path, monkeypatch, sizes, dtype, block,
                                              context):
    """Weight-only FP8 projections (quantised while loading, 128 x 128 block scales; the LM
    head stays in the model dtype): the kernel dequantises each 16-code load with its block's
    scale, rounded to the model dtype as the plan run does. fp32: relative error < 1e-5;
    bf16: < 2e-2. Through the page ring (2 pages): bit-identical to global reads. Blocks of
    5-8 rows take the projections' unrolled main loop (2048 columns a step) at K = 2176."""
    from dlrt import LLM
    from dlrt.checkpoint.make import make_checkpoint
    from dlrt.runtime.persistent.kernel import PersistentRound

    hf = preset("tiny-sdar")[0]
    h, inter, heads, kv_heads, d = sizes
    hf.update(hidden_size=h, intermediate_size=inter, num_attention_heads=heads,
              num_key_value_heads=kv_heads, head_dim=d, num_hidden_layers=2)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(hf))
    path = make_checkpoint(tmp_path / "cfg", tmp_path / "ckpt", dtype="float32")
    llm = LLM(path, device="cuda", dtype=str(dtype)[6:], max_model_len=512,
              quantization="fp8", fp8_activations="weight_only")
    model, config = llm.model, llm.config
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    made = [PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim,
                         context + 64, dtype, "cuda") for _ in range(3)]
    gen = torch.Generator().manual_seed(context)
    for c in made:  # the same random context in every cache
        torch.manual_seed(context)
        c.k.normal_()
        c.v.normal_()
    tokens = torch.randint(0, config.vocab_size, (block,), generator=gen).cuda()
    lens = torch.tensor([context, context + block], dtype=torch.int32, device="cuda")
    plan = build_plan(config, block, workers=7, splits=3,
                      itemsize=lambda w: model.get_parameter(w).element_size())
    want = run_plan(plan, model, made[0], tokens, lens, block)
    out = []
    for pages, cache in zip((0, 2), made[1:], strict=True):
        if pages and torch.cuda.get_device_capability() < (9, 0):
            break
        monkeypatch.setenv("DLRT_PERSISTENT_PAGES", str(pages))
        out.append(PersistentRound(plan, model, cache, lens, block).forward(tokens).clone())
        torch.cuda.synchronize()
    assert _rel(out[0], want) < (1e-5 if dtype == torch.float32 else 2e-2)
    assert all(torch.equal(o, out[0]) for o in out[1:])


@pytest.mark.gpu
def test_graph_and_while_node_replay_gpu():
    from dlrt.runtime.graphs import WhileGraph
    from dlrt.runtime.persistent.kernel import PersistentRound

    config = tiny(**AWKWARD)
    model, (cache,), _, tokens, lens = _setup(config, torch.bfloat16, 4, 9, caches=1)
    rnd = PersistentRound(build_plan(config, 4, workers=6, splits=2), model, cache, lens, 4)
    eager = rnd.forward(tokens).clone()
    torch.cuda.synchronize()
    assert not rnd.counters.any()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = rnd.forward(tokens)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and not rnd.counters.any()
    # another context, read by the same graph (after the block: the prompt's keys stay)
    lens.copy_(torch.tensor([13, 17]))
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    assert torch.equal(replayed, rnd.forward(tokens)) and not torch.equal(replayed, eager)
    lens.copy_(torch.tensor([9, 13]))
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")

    def begin():
        count.zero_()
        flag.fill_(1)

    def body():
        rnd.forward(tokens)
        count.add_(1)
        flag.copy_((count < 5).int())

    with torch.cuda.stream(stream):
        wg = WhileGraph(begin, body, lambda: None, flag)
        wg.launch()
    torch.cuda.synchronize()
    assert int(count) == 5 and torch.equal(rnd.logits, eager) and not rnd.counters.any()


@pytest.mark.gpu
def test_timeline_stamps_every_task_gpu(monkeypatch):
    from dlrt.runtime.persistent.kernel import PersistentRound, timeline_summary

    config = tiny(**AWKWARD)
    model, (cache,), _, tokens, lens = _setup(config, torch.bfloat16, 4, 9, caches=1)
    plan = build_plan(config, 4, workers=6, splits=2)
    rnd = PersistentRound(plan, model, cache, lens, 4, timeline=True)
    rnd.forward(tokens)
    torch.cuda.synchronize()
    s = rnd.timeline.cpu()
    assert (s[:, :3] > 0).all() and (s[:, 0] <= s[:, 1]).all() and (s[:, 1] <= s[:, 2]).all()
    assert not s[:, 3].any()  # no page ring: no page waits
    plain = PersistentRound(plan, model, cache, lens, 4)
    assert rnd.stamped() is rnd and plain.stamped() is plain.stamped()
    assert plain.timeline is None and plain.stamped().timeline is not None
    summary = timeline_summary(plan, s)
    assert summary["span_us"] > 0 and len(summary["busy_us"]) == plan.workers
    if torch.cuda.get_device_capability() >= (9, 0):  # with the ring: page waits within work
        monkeypatch.setenv("DLRT_PERSISTENT_PAGES", "2")
        rnd = PersistentRound(plan, model, cache, lens, 4, timeline=True)
        rnd.forward(tokens)
        torch.cuda.synchronize()
        s = rnd.timeline.cpu()
        assert rnd.pages == 2 and (s[:, 3] >= 0).all() and (s[:, 3] <= s[:, 2] - s[:, 1]).all()
