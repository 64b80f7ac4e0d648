"""The persistent round kernel (`csrc/persistent_round.cu`) on a model, its KV cache and a
round plan: the plan encoded as int32 tensors, the kernel's parameters in one device buffer,
one launch of `plan.workers` resident CTAs per round.

    rnd = PersistentRound(plan, model, cache, lens, chunk_block)
    logits = rnd.forward(tokens)      # [B, V]; the block's K/V written into the cache

With DLRT_PERSISTENT_PREFETCH > 0 (default 0: off, it measured slower), a CTA that picks a
task asks L2 to prefetch that many first bytes of the weight rows of the next projection in its
queue (`dlrt.env`), so they stream during this task's waits and work. With
DLRT_PERSISTENT_PAGES > 0 (sm_90), the projections read their weights from a ring of that many
32 KiB shared-memory pages instead, which one thread fills with bulk copies in the order the
CTA will use them, pages ahead of the task that needs them (`ring_layout`; the ring's own
description is in the CUDA source).
`lens` is a static int32 [2] device buffer (start, kv_len) the caller fills before each round,
so one captured launch serves every context. forward() is capturable (a CUDA graph, or the
body of the block graph's WHILE node): the kernel zeroes its counters at the end of a round.
Dense SDAR models in bf16 or fp32 with a cache of the model dtype, projections in the model
dtype or weight-only FP8 (128 x 128 block scales, `dlrt.layers.quant.fp8`: the weight is the
code times its scale rounded to the model dtype, as the layer path dequantises it); block rows
<= 16, head_dim a multiple of 32 up to 256, every projection's K a multiple of 16 bytes (and of
16 elements for FP8).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from dlrt import env
from dlrt.attention.kv_cache import PagedKVCache
from dlrt.errors import OptionError
from dlrt.kernels.cubin import VOID_P, Kernel
from dlrt.models.config import ModelConfig
from dlrt.models.registry import family
from dlrt.runtime.persistent.plan import RoundPlan, build_plan, fp8_layer, round_weights

FP8 = torch.float8_e4m3fn

KINDS = {"qkv": 0, "attn": 1, "o": 2, "gate_up": 3, "down": 4, "lm_head": 5}
THREADS = 256
MAX_B = 16
PAGE_BYTES = 32 * 1024  # a weight page: 16 rows by PAGE_BYTES / (16 * itemsize) columns
MAX_PAGES = 6
BLOCK_BOUNDS = (4, 8, MAX_B)  # one kernel per bound: its loops over block rows unrolled to it
CHUNK_KEYS = 32  # CH of csrc/persistent_round.cu: keys per attention chunk in shared memory
# norm_rope's per-warp rows, the parameters, the task, the page ring's mbarriers (ptxas: 8672)
STATIC_SHARED = 9 * 1024
_KERNELS: dict[tuple[torch.dtype, int], Kernel] = {}


class _Params(ctypes.Structure):
    """`Params` of csrc/persistent_round.cu, field for field."""

    _fields_ = ([(n, VOID_P) for n in ("task", "wait_off", "waits", "sig_off", "sigs",
                                        "queue_off", "queue", "counters")]
                + [(n, ctypes.c_int) for n in ("num_counters", "B", "H", "Hq", "Hkv", "D", "I",
                                                "V", "L", "splits", "chunk_block", "rot_half",
                                                "full_rope", "page_size")]
                + [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
                + [(n, VOID_P) for n in ("weights", "in_norm", "post_norm", "q_norm", "k_norm",
                                          "final_norm", "k_cache", "v_cache", "page_table",
                                          "lens", "cos", "sin", "stream", "qkv", "attn_out",
                                          "act", "logits", "part_ml", "part_o", "timeline")]
                + [("prefetch_bytes", ctypes.c_longlong), ("wait_limit_ns", ctypes.c_longlong)]
                + [("pages", ctypes.c_int), ("page_offset", ctypes.c_int)]
                + [("scales", VOID_P), ("wmeta", VOID_P)])


def encode(plan: RoundPlan, device) -> dict[str, torch.Tensor]:
    """The plan as the kernel reads it: task [T, 8] (kind, layer, lo, hi, head, split, weight
    index, the `then` counter or -1), wait_off / sig_off [T + 1] with waits [NW, 2] (counter,
    count) and sigs [NS], queue_off [W + 1] with queue [T]; int32 on `device`. Also
    `weights`: the weight names in index order (a list, not a tensor). ValueError for a
    `then` the kernel does not run (only the merge after a head's last attention split)."""
    names: list[str] = []
    rows, wait_off, waits, sig_off, sigs = [], [0], [], [0], []
    final = plan.final_counts()
    for t in plan.tasks:
        widx = -1
        if t.weight is not None:
            if t.weight not in names:
                names.append(t.weight)
            widx = names.index(t.weight)
        if t.then and (t.kind != "attn" or len(t.then) != 1
                       or final[t.signals[0]] != plan.splits):
            raise ValueError(f"task {t.id} ({t.kind}): the kernel merges after the last of "
                             "a head's attention splits only")
        rows.append([KINDS[t.kind], t.layer, t.lo, t.hi, t.head, t.split, widx,
                     t.then[0] if t.then else -1])
        waits += [list(w) for w in t.waits]
        wait_off.append(len(waits))
        sigs += list(t.signals)
        sig_off.append(len(sigs))
    queue_off = [0]
    for q in plan.queues:
        queue_off.append(queue_off[-1] + len(q))

    def i32(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    return dict(task=i32(rows), wait_off=i32(wait_off),
                waits=i32(waits or [[0, 0]]), sig_off=i32(sig_off), sigs=i32(sigs or [0]),
                queue_off=i32(queue_off), queue=i32([i for q in plan.queues for i in q]),
                weights=names)


KERNEL_NAMES = tuple(f"dlrt_persistent_round_{t}_b{n}" for t in ("bf16", "f32")
                     for n in BLOCK_BOUNDS)


def kernel_id(name: str) -> int:
    """The DLRT_ROUND_ONLY value that builds only kernel `name` (1..6, the source's order)."""
    return KERNEL_NAMES.index(name) + 1


def block_bound(block: int) -> int:
    """The kernel serving `block` rows: the smallest of BLOCK_BOUNDS >= block."""
    return next(n for n in BLOCK_BOUNDS if block <= n)


def shared_bytes(plan: RoundPlan, itemsize: int) -> int:
    """Dynamic shared memory of a CTA: the larger of a projection's staged input rows (B rows
    of the widest K) and an attention task's K/V chunk (CH keys, rows padded by 16 bytes)
    with its query rows and their online-softmax states (fp32) and the block's own K/V rows
    (B x D each)."""
    c = plan.config
    d, rows = c.head_dim, plan.block * (c.num_heads // c.num_kv_heads)
    widest = max(c.hidden_size, c.num_heads * d, c.intermediate_size)
    gemv = plan.block * widest * itemsize
    attn = (2 * CHUNK_KEYS * (d * itemsize + 16) + (2 * rows * d + 2 * rows) * 4
            + 16 + 2 * plan.block * d * itemsize)  # the block's K/V from a 16-byte boundary
    return max(gemv, attn)


def ring_layout(plan: RoundPlan, itemsize: int, requested: int, limit: int,
                cc: tuple[int, int]) -> tuple[int, int, int]:
    """The weight page ring a CTA gets: (pages, byte offset of the ring in the dynamic shared
    memory, dynamic shared bytes in all). `requested` pages (DLRT_PERSISTENT_PAGES), at most
    MAX_PAGES and as many as fit in `limit` bytes a CTA beside the static part and
    `shared_bytes`; none before sm_90 (compute capability `cc`), which has no bulk copies."""
    base = shared_bytes(plan, itemsize)
    offset = -(-base // 128) * 128
    fit = max(0, (limit - STATIC_SHARED - offset) // PAGE_BYTES)
    pages = min(requested, MAX_PAGES, fit) if cc >= (9, 0) else 0
    return pages, offset, offset + pages * PAGE_BYTES if pages else base


def check_supported(plan: RoundPlan, dtype: torch.dtype, device: torch.device) -> None:
    """ValueError naming what the kernel does not serve (module docstring)."""
    c = plan.config
    item = torch.tensor([], dtype=dtype).element_size()
    problems = []
    if dtype not in (torch.bfloat16, torch.float32):
        problems.append(f"dtype {dtype} (bfloat16 or float32)")
    if not 1 <= plan.block <= MAX_B:
        problems.append(f"block {plan.block} (1..{MAX_B})")
    if c.head_dim % 32 or c.head_dim > 256:
        problems.append(f"head_dim {c.head_dim} (a multiple of 32 up to 256)")
    for name, k in (("hidden_size", c.hidden_size), ("heads * head_dim",
                                                     c.num_heads * c.head_dim),
                    ("intermediate_size", c.intermediate_size)):
        if (k * item) % 16:
            problems.append(f"{name} {k} ({16 // item}-element multiples)")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        if (props.major, props.minor) < (8, 0):
            problems.append(f"compute capability {props.major}.{props.minor} (8.0 or later)")
        limit = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
        need = shared_bytes(plan, item)
        if need + STATIC_SHARED > limit:
            problems.append(f"{need} bytes of shared memory a CTA (staged input rows or an "
                            f"attention chunk; at most {limit - STATIC_SHARED})")
        if plan.workers > props.multi_processor_count:
            problems.append(f"{plan.workers} workers on {props.multi_processor_count} SMs")
    if problems:
        raise ValueError("the persistent round kernel does not serve: " + "; ".join(problems))


def check_resident(gpu: str, sms: int, per_sm: int, ctas: int, shared: int) -> None:
    """Refuse a launch whose `ctas` CTAs cannot all be resident at once: the kernel's CTAs wait
    on each other, so one left waiting for an SM would spin until the wait limit traps.
    `per_sm`: how many CTAs of the kernel (its threads, registers and `shared` bytes of dynamic
    shared memory) fit one SM (cuOccupancyMaxActiveBlocksPerMultiprocessor); `sms` the GPU's.

    Raises:
        OptionError: naming the GPU, its SMs, the CTAs that fit and what to do instead.
    """
    if per_sm * sms >= ctas:
        return
    raise OptionError(
        f"the persistent round kernel needs its {ctas} CTAs resident at once, and {gpu} "
        f"({sms} SMs) fits {per_sm} per SM with {shared} bytes of dynamic shared memory, "
        f"{per_sm * sms} in all: use round_kernel='layers' (or fewer DLRT_PERSISTENT_PAGES)")


def _fp8_scales(model, name: str, weight: torch.Tensor) -> tuple[torch.Tensor | None,
                                                                   list[int]]:
    """(scales, [is e4m3, weight rows per scale row]) of the projection weight `name`: for a
    weight-only FP8 layer (`dlrt.layers.quant.fp8`) its float32 block scales
    [ceil(N/128) or N, ceil(K/128)]; else (None, [0, 1]).

    Raises ValueError for an FP8 layer whose activations are quantised (W8A8: the kernel
    computes the weight-only product) or whose K is not a multiple of 16."""
    module = fp8_layer(model, name)
    if module is None:
        return None, [0, 1]
    n, k = weight.shape
    if k % 16:
        raise ValueError(f"PersistentRound: {name} has K {k}; FP8 weights need a multiple "
                         "of 16 (one 16-byte load)")
    scale = module.weight_scale_inv
    if scale.dtype != torch.float32 or not scale.is_contiguous():
        raise ValueError(f"PersistentRound: {name}'s scales must be contiguous float32")
    return scale, [1, 1 if scale.shape[0] == n else 128]


def _ptrs(tensors, device) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


class PersistentRound:
    """The kernel bound to one model, cache, plan and lens buffer (module docstring); with
    `timeline`, each round also stamps every task (`self.timeline`, `timeline_summary`).

    Raises ValueError when the kernel does not serve the plan (`check_supported`), the model's
    weights are not plain tensors of one dtype, or the cache is not of that dtype; OptionError
    when the GPU cannot hold every CTA at once (`check_resident`)."""

    def __init__(self, plan: RoundPlan, model, cache: PagedKVCache, lens: torch.Tensor,
                 chunk_block: int | None, timeline: bool = False):
        c, names = plan.config, plan.weights
        embedding = model.get_parameter(names.embedding)
        rotary = model.get_submodule(names.rotary)
        dtype, dev = embedding.dtype, embedding.device
        check_supported(plan, dtype, dev)
        if cache.dtype != dtype or lens.dtype != torch.int32 or lens.device != dev:
            raise ValueError(f"PersistentRound: a {cache.dtype} cache and {lens.dtype} lens "
                             f"for a {dtype} model on {dev}")
        self.plan, self.model, self.cache, self.lens = plan, model, cache, lens
        self.embedding, self.rotary = embedding, rotary
        self.chunk_block = chunk_block
        self._stamped: PersistentRound | None = None
        self.dtype, self.device = dtype, dev
        item = torch.tensor([], dtype=dtype).element_size()
        enc = encode(plan, dev)
        weight_names = enc.pop("weights")
        weights = [model.get_parameter(n) for n in weight_names]  # tied ones too
        scales, wmeta = [], []
        for name, w in zip(weight_names, weights, strict=True):
            scale, meta = _fp8_scales(model, name, w)
            scales.append(scale)
            wmeta.append(meta)
        if any(w.dtype not in (dtype, FP8) or not w.is_contiguous() or w.data_ptr() % 16
               for w in weights):
            raise ValueError("PersistentRound: the projections must be contiguous "
                             f"{dtype} or float8_e4m3fn weights at 16-byte aligned addresses "
                             "(the kernel reads 16 bytes at a time)")
        if any(t.data_ptr() % 16 for t in (*cache.k, *cache.v)):
            raise ValueError("PersistentRound: the KV cache's layers must start at 16-byte "
                             "aligned addresses")
        def per_layer(name: str) -> list[torch.Tensor]:
            return [model.get_parameter(names.at(name, i)) for i in range(c.num_layers)]

        in_norm, post_norm = per_layer("input_norm"), per_layer("post_norm")
        final_norm = model.get_parameter(names.final_norm)
        norms = [final_norm, *in_norm, *post_norm]
        if any(n.dtype != dtype or not n.is_contiguous() or n.data_ptr() % 16 for n in norms):
            raise ValueError("PersistentRound: the RMSNorm weights before the projections must "
                             f"be contiguous {dtype} at 16-byte aligned addresses (the kernel "
                             "reads them 16 bytes at a time)")
        self._keep = [enc, weights]
        b, d = plan.block, c.head_dim
        new = lambda *shape: torch.zeros(*shape, dtype=dtype, device=dev)  # noqa: E731
        self.stream, self.qkv = new(b, c.hidden_size), new(b, (c.num_heads + 2 *
                                                                c.num_kv_heads) * d)
        self.attn_out = new(b, c.num_heads * d)
        self.act, self.logits = new(b, c.intermediate_size), new(b, c.vocab_size)
        rows = b * (c.num_heads // c.num_kv_heads)
        self.part_ml = torch.zeros(c.num_kv_heads * plan.splits * rows * 2, device=dev)
        self.part_o = torch.zeros(c.num_kv_heads * plan.splits * rows * d, device=dev)
        self.counters = torch.zeros(len(plan.counter_names) + 1, dtype=torch.int32,
                                    device=dev)
        half = rotary.inv_freq.numel()
        self.cos = torch.zeros(b, half, device=dev)
        self.sin = torch.zeros(b, half, device=dev)
        self.arange = torch.arange(b, device=dev)
        ptr_lists = dict(
            weights=weights, in_norm=in_norm, post_norm=post_norm,
            q_norm=per_layer("q_norm"), k_norm=per_layer("k_norm"),
            k_cache=list(cache.k), v_cache=list(cache.v))
        ptrs = {k: _ptrs(v, dev) for k, v in ptr_lists.items()}
        ptrs["scales"] = torch.tensor([0 if t is None else t.data_ptr() for t in scales],
                                      dtype=torch.int64, device=dev)
        ptrs["wmeta"] = torch.tensor(wmeta, dtype=torch.int32, device=dev)
        self._keep += [ptrs, scales]
        p = _Params(num_counters=len(plan.counter_names), B=b, H=c.hidden_size,
                    Hq=c.num_heads, Hkv=c.num_kv_heads, D=d, I=c.intermediate_size,
                    V=c.vocab_size, L=c.num_layers, splits=plan.splits,
                    chunk_block=chunk_block or 0, rot_half=half,
                    full_rope=int(rotary.full_precision), page_size=cache.page_size,
                    eps=c.rms_norm_eps, scale=d ** -0.5,
                    final_norm=final_norm.data_ptr(),
                    page_table=cache.page_table.data_ptr(), lens=lens.data_ptr(),
                    counters=self.counters.data_ptr())
        for k in ("task", "wait_off", "waits", "sig_off", "sigs", "queue_off", "queue"):
            setattr(p, k, enc[k].data_ptr())
        for k, v in ptrs.items():
            setattr(p, k, v.data_ptr())
        for k in ("cos", "sin", "stream", "qkv", "attn_out", "act", "logits", "part_ml",
                  "part_o"):
            setattr(p, k, getattr(self, k).data_ptr())
        # per task: picked, waits done, work done (globaltimer ns), ns waited for weight pages;
        # see `timeline_summary`
        self.timeline = (torch.zeros(len(plan.tasks), 4, dtype=torch.int64, device=dev)
                         if timeline else None)
        p.timeline = self.timeline.data_ptr() if timeline else None
        p.prefetch_bytes = env.persistent_prefetch_bytes()
        p.wait_limit_ns = int(env.persistent_wait_limit_s() * 1e9)
        props = torch.cuda.get_device_properties(dev)
        limit = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
        p.pages, p.page_offset, self.smem = ring_layout(
            plan, item, env.persistent_pages(), limit, (props.major, props.minor))
        self.pages = p.pages  # the weight page ring (0: weights read from global memory)
        raw = bytes(p)
        self.params = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(dev)
        bound = block_bound(b)  # the kernel unrolled for B <= bound
        if (dtype, bound) not in _KERNELS:
            name = (f"dlrt_persistent_round_{'bf16' if dtype == torch.bfloat16 else 'f32'}"
                    f"_b{bound}")
            _KERNELS[dtype, bound] = Kernel("persistent_round.cu", name, "the persistent round",
                                            defines={"DLRT_ROUND_ONLY": str(kernel_id(name))})
        self.kernel = _KERNELS[dtype, bound]
        self.kernel.set_shared_bytes(self.smem)
        # NOTE: before the first launch: every CTA resident at once, or a named error
        check_resident(props.name, props.multi_processor_count,
                       self.kernel.max_blocks_per_sm(THREADS, self.smem), plan.workers,
                       self.smem)

    def stamped(self) -> PersistentRound:
        """This round's twin that stamps every task (`timeline=True`): the same plan, model,
        cache and lens buffer; built on the first call, then reused."""
        if self.timeline is not None:
            return self
        if self._stamped is None:
            self._stamped = PersistentRound(self.plan, self.model, self.cache, self.lens,
                                            self.chunk_block, timeline=True)
        return self._stamped

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B] int64 at positions lens[0].. -> logits [B, V] (a buffer the next call
        overwrites); writes the block's K/V into the cache. No host sync.

        The kernel's CTAs wait on each other: it needs every one of its `plan.workers` CTAs
        resident at once (one per SM, checked at construction), so nothing else may occupy
        the SMs while it runs (no concurrent stream, no SM partitioning). A CTA that waits
        longer than DLRT_PERSISTENT_WAIT_LIMIT seconds (default 2; 0: no limit) for a
        dependency prints which and traps (a CUDA error, the process's context lost) rather
        than hanging the device.

        Raises ValueError when tokens do not have the plan's block length."""
        if tokens.shape[0] != self.plan.block:
            raise ValueError(f"PersistentRound: {tokens.shape[0]} tokens for a plan of block "
                             f"{self.plan.block}")
        self.stream.copy_(F.embedding(tokens, self.embedding))
        positions = self.lens[0].long() + self.arange
        cos, sin = self.rotary.cos_sin(positions)
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.kernel.launch(self.plan.workers, THREADS, (self.params.data_ptr(),), (VOID_P,),
                           self.smem)
        return self.logits


class PersistentRounds:
    """The kernel for the forwards of the block decoder: its rounds (B tokens) and, where the
    kernel serves 2B rows, the folded round 0 of a block ([previous block + block]),
    chunk_block = B,
    each with its own plan (one worker per SM; KV-head x split attention tasks about one per
    SM) and lens buffer. `forward` returns None for any other forward (the layers serve it).
    `supports` says what it serves before anything is built."""

    @staticmethod
    def supports(device: torch.device, tensor_parallel_size: int = 1,
                 config: ModelConfig | None = None, decoder: str | None = None,
                 dtype: torch.dtype | None = None, kv_cache_dtype: torch.dtype | None = None,
                 quantization: str | None = None, fp8_activations: str | None = None
                 ) -> str | None:
        """None when the persistent round serves this device, tensor-parallel size and (those
        given; None: not known yet) model, decoder, model dtype, KV cache dtype, quantisation
        and FP8 activation mode; else the reason, naming each thing it does not serve. What
        depends on the GPU and the plan (head size, SMs, shared memory) is checked when it is
        built (`check_supported`)."""
        if device.type != "cuda":
            return "round_kernel 'persistent' needs a CUDA device; use 'layers'"
        if tensor_parallel_size > 1:
            return ("round_kernel 'persistent' runs one GPU's whole round; with "
                    f"tensor_parallel_size {tensor_parallel_size} use 'layers'")
        why = []
        if config is not None and (config.moe_layers
                                   or family(config.family).round_weights is None):
            why.append(f"model family {config.family} (dense SDAR only: the families whose "
                       "record names the round's weights, Family.round_weights)")
        if decoder not in (None, "block"):
            why.append(f"decoder {decoder} (block only)")
        if dtype is not None and dtype not in (torch.bfloat16, torch.float32):
            why.append(f"dtype {dtype} (bfloat16 or float32)")
        if quantization not in (None, "none", "fp8"):
            why.append(f"quantization {quantization} (unquantised or weight-only fp8 weights "
                       "only)")
        elif quantization == "fp8" and fp8_activations not in (None, "weight_only"):
            why.append(f"fp8 with fp8_activations {fp8_activations} (the kernel computes the "
                       "weight-only product: fp8_activations='weight_only')")
        if kv_cache_dtype is not None and dtype is not None and kv_cache_dtype != dtype:
            why.append(f"KV cache {kv_cache_dtype} (a cache of the model dtype only)")
        if why:
            return "round_kernel 'persistent' does not serve: " + "; ".join(why)
        return None

    def __init__(self, model, cache: PagedKVCache, block: int):
        self.model, self.cache, self.block = model, cache, block
        self.rounds: dict[int, PersistentRound] = {}
        self.rebuild()

    def release(self) -> None:
        """Drop the rounds (their buffers, and the pointers to the weights and the cache)."""
        self.rounds = {}

    def rebuild(self) -> None:
        """Build the rounds on the model's and the cache's current tensors."""
        model, cache, block = self.model, self.cache, self.block
        c = model.config
        embedding = model.get_parameter(round_weights(c).embedding)
        dev = embedding.device
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        splits = max(1, min(64, sms // c.num_kv_heads))
        self.rounds = {}
        def item(weight: str) -> int:  # bytes per element of each weight (FP8 layers: 1)
            return model.get_parameter(weight).element_size()

        for n in (block, 2 * block):
            plan = build_plan(c, n, sms, splits, itemsize=item)
            if n == 2 * block:  # the folded round only where it fits; else the layers
                try:
                    check_supported(plan, embedding.dtype, dev)
                except ValueError:
                    continue
            lens = torch.zeros(2, dtype=torch.int32, device=dev)
            self.rounds[n] = PersistentRound(plan, model, cache, lens, block)

    def forward(self, tokens: torch.Tensor, lens: torch.Tensor,
                chunk_block: int | None) -> torch.Tensor | None:
        rnd = self.rounds.get(tokens.shape[0])
        if rnd is None or chunk_block != self.block:
            return None
        rnd.lens.copy_(lens)
        return rnd.forward(tokens)


def timeline_summary(plan: RoundPlan, stamps: torch.Tensor) -> dict:
    """Where a round's time went, from the kernel's stamps ([T, 4] ns: picked, waits done, work
    done, time waited for weight pages within the work; [T, 3]: no page column). Per worker
    (SM): busy (running tasks; includes the page waits) and waiting (on a dependency's
    counters), microseconds; their means over the workers, the mean page wait, and the span of
    the round (first pick to last finish); busy, waiting and page-wait microseconds by task
    kind (summed over the workers); the weight bandwidth of each projection kind, its weight
    bytes over its busy time spread over the workers (GB/s); the handoff, mean microseconds
    from the finish of the last task a waiting task depends on to its work starting (the cost
    of one dependency: the signal, the poll, the pick), overall and by kind."""
    s = stamps.to("cpu", torch.int64)
    if s.shape[1] == 3:
        s = torch.cat([s, torch.zeros(s.shape[0], 1, dtype=torch.int64)], dim=1)
    busy = [sum(int(s[t, 2] - s[t, 1]) for t in q) / 1e3 for q in plan.queues]
    wait = [sum(int(s[t, 1] - s[t, 0]) for t in q) / 1e3 for q in plan.queues]
    pages = [sum(int(s[t, 3]) for t in q) / 1e3 for q in plan.queues]
    kinds: dict[str, float] = {}
    waits: dict[str, float] = {}
    page_kinds: dict[str, float] = {}
    weight_bytes: dict[str, int] = {}
    for t in plan.tasks:
        kinds[t.kind] = kinds.get(t.kind, 0.0) + int(s[t.id, 2] - s[t.id, 1]) / 1e3
        waits[t.kind] = waits.get(t.kind, 0.0) + int(s[t.id, 1] - s[t.id, 0]) / 1e3
        page_kinds[t.kind] = page_kinds.get(t.kind, 0.0) + int(s[t.id, 3]) / 1e3
        weight_bytes[t.kind] = weight_bytes.get(t.kind, 0) + t.weight_bytes
    n = max(len(busy), 1)
    gbps = {k: weight_bytes[k] / (kinds[k] / n) / 1e3 for k in kinds
            if weight_bytes[k] and kinds[k] > 0}
    # handoff: from the moment a task's last dependency finished to its work starting, for
    # the tasks that were picked before that moment (they waited on it)
    done_at = [0] * len(plan.counter_names)
    for t in plan.tasks:
        for c in (*t.signals, *t.then):  # a `then` counter: its head's last split's finish
            done_at[c] = max(done_at[c], int(s[t.id, 2]))
    hand: dict[str, list[float]] = {}
    for t in plan.tasks:
        if t.waits:
            ready = max(done_at[c] for c, _ in t.waits)
            if ready > int(s[t.id, 0]):
                hand.setdefault(t.kind, []).append((int(s[t.id, 1]) - ready) / 1e3)
    every = [x for v in hand.values() for x in v]
    return dict(span_us=int(s[:, 2].max() - s[:, 0].min()) / 1e3, busy_us=busy, wait_us=wait,
                page_wait_us=pages, mean_busy_us=sum(busy) / n, mean_wait_us=sum(wait) / n,
                mean_page_wait_us=sum(pages) / n, busy_by_kind_us=kinds,
                wait_by_kind_us=waits, page_wait_by_kind_us=page_kinds, gbps_by_kind=gbps,
                handoff_us=sum(every) / len(every) if every else 0.0,
                handoff_by_kind_us={k: sum(v) / len(v) for k, v in hand.items()})
