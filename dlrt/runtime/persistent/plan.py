"""The static plan of a persistent round: the forward of a block split into tasks, dependencies
as counters, tasks assigned to one worker (CTA) per SM.

A round of a dense SDAR model (B block rows, hidden H, Hq / Hkv heads of D, intermediate I,
L layers) becomes, per layer l:

  qkv      row tiles of the merged q/k/v weight [(Hq + 2 Hkv) D, H]; prologue: RMSNorm
           (input_layernorm) of the residual stream
  attn     per KV head g and context split: q/k RMSNorm and RoPE of its G = Hq / Hkv query
           heads and of the block's K (split 0 also writes the block's K/V into the cache;
           the other splits take the block's keys from their own computation, never from the
           cache being written), then the split's partial softmax state (the keys of a split
           follow the context read from device memory, as `dlrt.kernels.paged_attention`);
           the split that finishes last merges the head's splits into the attention output
           [B, G D] of its heads (`Task.then`)
  o        row tiles of o_proj; epilogue: the residual stream += the tile's output
  gate_up  row tiles of the intermediate size (gate rows lo..hi and up rows I+lo..I+hi);
           prologue: RMSNorm (post_attention_layernorm) of the stream; epilogue: SiLU-and-mul
  down     row tiles of down_proj; epilogue: the stream += the tile's output

and after the last layer `lm_head` row tiles of the vocabulary (prologue: the final RMSNorm).
The stream starts as the block's embedding rows (written before the round).

Dependencies are counters in device memory. A task waits until each counter it names has
reached a count, and on completion adds one to each counter it signals:
  qkv[l][g]   the qkv tiles overlapping KV head g's q, k or v columns -> attn(l, g, s)
  attn[l][g]  the splits of head g; the task that brings it to `splits` merges and adds one
              to merged[l]
  merged[l]   all heads -> every o tile; o[l] -> gate_up; gate_up[l] -> down;
  down[l]     -> every qkv tile of layer l + 1, or the lm_head tiles.
Five dependent steps a layer. The stream is never read and written at once: o tiles write it
only after every qkv tile of their layer has read it (every qkv column belongs to some head,
and o waits for all heads), gate_up reads it after all o tiles, down writes it after all
gate_up tiles.

Each worker runs its queue in order; every queue follows one global order of the tasks that
respects the dependencies, so with all workers resident the first unfinished task of that order
can always run: no deadlock (`simulate` checks it). A worker knows the weight rows of its next
tasks before their inputs exist, so it can stream them into shared memory ahead (the page
ring). At the end of a round every counter holds its final count; the last worker to finish
zeroes them for the next round (`final_counts`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dlrt.models.config import ModelConfig
from dlrt.models.family import RoundWeights
from dlrt.models.registry import family

GEMM_KINDS = ("qkv", "o", "gate_up", "down", "lm_head")


@dataclass(frozen=True)
class Task:
    """One unit of work. GEMM kinds: output rows lo..hi of `weight` (for gate_up: gate rows
    lo..hi and the matching up rows). attn: KV head `head`, context split `split`.
    waits: (counter, count) pairs; signals: counters it adds one to when done; then: counters
    it adds one to after more work (the merge) if its signal brought signals[0] to that
    counter's final count (it finished last of the tasks signalling it)."""

    id: int
    kind: str
    layer: int  # -1: after the last layer (lm_head)
    lo: int = 0
    hi: int = 0
    head: int = -1
    split: int = -1
    waits: tuple[tuple[int, int], ...] = ()
    signals: tuple[int, ...] = ()
    then: tuple[int, ...] = ()  # added to by the task whose signal completes signals[0]
    weight: str | None = None  # the parameter whose rows lo..hi the task streams
    weight_bytes: int = 0


@dataclass
class RoundPlan:
    """tasks in a global dependency order; queues[w]: the task ids worker w runs, in order;
    counter_names[c]: what counter c counts."""

    config: ModelConfig
    block: int
    splits: int
    tasks: list[Task]
    queues: list[list[int]]
    counter_names: list[str] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return len(self.queues)

    @property
    def weights(self) -> RoundWeights:
        """The paths of the weights the round reads (the family's, `round_weights`)."""
        return round_weights(self.config)

    def final_counts(self) -> list[int]:
        """The count each counter reaches in one round: the tasks signalling it, plus one for
        each counter whose completing task adds to it (`Task.then`)."""
        counts = [0] * len(self.counter_names)
        completing: dict[int, tuple[int, ...]] = {}
        for t in self.tasks:
            for c in t.signals:
                counts[c] += 1
            if t.then:
                completing[t.signals[0]] = t.then
        for then in completing.values():
            for c in then:
                counts[c] += 1
        return counts


def round_weights(config: ModelConfig) -> RoundWeights:
    """The paths of the weights a round reads, from the family's record
    (`Family.round_weights`). ValueError for a MoE model or a family whose record names none."""
    if config.moe_layers:
        raise ValueError("the persistent round plan serves dense models; MoE layers keep "
                         "the layer-by-layer path")
    names = family(config.family).round_weights
    if names is None:
        raise ValueError(f"the persistent round plan serves the families whose record names "
                         f"its weights (Family.round_weights: dense SDAR); {config.family} "
                         "names none")
    return names


def fp8_layer(model, weight: str):
    """The weight-only FP8 layer (`dlrt.layers.quant.fp8`) holding the projection weight at
    path `weight`, or None for a weight in the model dtype. ValueError for an FP8 layer with
    quantised activations (W8A8), which the persistent round does not compute."""
    if model.get_parameter(weight).dtype != torch.float8_e4m3fn:
        return None
    module = model.get_submodule(weight.rpartition(".")[0])
    activations = getattr(getattr(module, "method", None), "activations", "?")
    if activations != "weight_only":
        raise ValueError(f"{weight} is an FP8 layer with {activations} activations; the "
                         "persistent round computes the weight-only product "
                         "(fp8_activations='weight_only')")
    return module


def _tiles(n: int, rows: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + rows, n)) for lo in range(0, n, rows)]


def tile_rows(n: int, workers: int, multiple: int = 16, per_worker: int = 1) -> int:
    """Rows per tile so that an n-row weight makes about `per_worker` tiles per worker (a
    multiple of `multiple` rows, at least one multiple)."""
    want = -(-n // (workers * per_worker))
    return max(multiple, -(-want // multiple) * multiple)


def _head_columns(c: ModelConfig, g: int) -> list[tuple[int, int]]:
    """The merged qkv columns KV head g's attention tasks read: its query heads, its k, its v."""
    d, hq, hkv = c.head_dim, c.num_heads, c.num_kv_heads
    group = hq // hkv
    return [(g * group * d, (g + 1) * group * d), (hq * d + g * d, hq * d + (g + 1) * d),
            ((hq + hkv) * d + g * d, (hq + hkv) * d + (g + 1) * d)]


def build_plan(config: ModelConfig, block: int, workers: int, splits: int = 4,
               rows: dict[str, int] | None = None,
               itemsize: int | Callable[[str], int] = 2) -> RoundPlan:
    """The plan of one round of `block` rows of a dense SDAR-like model on `workers` workers.

    rows: rows per tile by kind ("qkv", "o", "gate_up", "down", "lm_head"); default
    `tile_rows` of each weight (about one tile per worker). itemsize: bytes per weight element
    (the page stream's bytes per task), one for all weights or a function of the weight's
    parameter path (FP8 projections beside a model-dtype LM head). The weights are the
    family's (`round_weights`). Raises ValueError for a MoE model, a family without round
    weights, heads that do not group, or non-positive sizes.
    """
    c = config
    weights = round_weights(c)
    if c.num_heads % c.num_kv_heads or block < 1 or workers < 1 or splits < 1:
        raise ValueError(f"build_plan: heads {c.num_heads}/{c.num_kv_heads}, block {block}, "
                         f"workers {workers}, splits {splits}")
    d, hq, hkv, h, inter = (c.head_dim, c.num_heads, c.num_kv_heads, c.hidden_size,
                            c.intermediate_size)
    sizes = {"qkv": (hq + 2 * hkv) * d, "o": h, "gate_up": inter, "down": h,
             "lm_head": c.vocab_size}
    k_of = {"qkv": h, "o": hq * d, "gate_up": h, "down": inter, "lm_head": h}
    rows = {k: (rows or {}).get(k) or tile_rows(n, workers) for k, n in sizes.items()}
    counters: list[str] = []

    def counter(name: str) -> int:
        counters.append(name)
        return len(counters) - 1

    tasks: list[Task] = []

    def add(kind, layer, **kw) -> None:
        tasks.append(Task(len(tasks), kind, layer, **kw))

    def gemm(kind, layer, waits, signals_of, weight):
        rows_per = 2 if kind == "gate_up" else 1  # gate and up rows
        for lo, hi in _tiles(sizes[kind], rows[kind]):
            item = itemsize if isinstance(itemsize, int) else itemsize(weight)
            add(kind, layer, lo=lo, hi=hi, waits=waits, signals=signals_of(lo, hi),
                weight=weight, weight_bytes=rows_per * (hi - lo) * k_of[kind] * item)

    prev: tuple[tuple[int, int], ...] = ()
    for layer in range(c.num_layers):
        qkv_c = [counter(f"qkv[{layer}][{g}]") for g in range(hkv)]
        cols = [_head_columns(c, g) for g in range(hkv)]

        def heads_of(lo, hi, cols=cols, qkv_c=qkv_c):
            return tuple(qkv_c[g] for g in range(hkv)
                         if any(a < hi and lo < b for a, b in cols[g]))

        gemm("qkv", layer, prev, heads_of, weights.at("qkv", layer))
        need = [sum(1 for t in tasks if t.kind == "qkv" and t.layer == layer
                    and qkv_c[g] in t.signals) for g in range(hkv)]
        attn_c = [counter(f"attn[{layer}][{g}]") for g in range(hkv)]
        merged_c = counter(f"merged[{layer}]")
        for g in range(hkv):
            for s in range(splits):
                add("attn", layer, head=g, split=s, waits=((qkv_c[g], need[g]),),
                    signals=(attn_c[g],), then=(merged_c,))
        o_c, gu_c, down_c = (counter(f"{k}[{layer}]") for k in ("o", "gate_up", "down"))
        n_o, n_gu, n_down = (len(_tiles(sizes[k], rows[k])) for k in ("o", "gate_up", "down"))
        gemm("o", layer, ((merged_c, hkv),), lambda lo, hi, o_c=o_c: (o_c,),
             weights.at("o", layer))
        gemm("gate_up", layer, ((o_c, n_o),), lambda lo, hi, gu_c=gu_c: (gu_c,),
             weights.at("gate_up", layer))
        gemm("down", layer, ((gu_c, n_gu),), lambda lo, hi, down_c=down_c: (down_c,),
             weights.at("down", layer))
        prev = ((down_c, n_down),)
    head_c = counter("lm_head")
    gemm("lm_head", -1, prev, lambda lo, hi: (head_c,), weights.lm_head)
    return RoundPlan(c, block, splits, tasks, assign(tasks, workers), counters)


def assign(tasks: list[Task], workers: int) -> list[list[int]]:
    """Queues in the tasks' order. A GEMM tile goes to the worker with the fewest weight bytes
    so far (ties: the lower worker); the attn tasks go round the workers in turn, so a
    layer's attention spreads over min(workers, its task count) SMs whatever the tiles' bytes
    (their context is unknown at plan time)."""
    heap = [(0, w) for w in range(workers)]
    queues: list[list[int]] = [[] for _ in range(workers)]
    turn = 0
    for t in tasks:
        if t.kind in GEMM_KINDS:
            load, w = heapq.heappop(heap)
            queues[w].append(t.id)
            heapq.heappush(heap, (load + t.weight_bytes, w))
        else:
            queues[turn % workers].append(t.id)
            turn += 1
    return queues


class PlanError(ValueError):
    """A plan that misses or repeats a piece of the round, waits for a count that is never
    reached, or can deadlock."""


def check_plan(plan: RoundPlan) -> None:
    """PlanError unless every output row of every GEMM is computed by exactly one task, every
    (head, split) has one attn task, each task runs on exactly one worker, every wait's count
    equals the count its counter reaches, and every wait names counters signalled only by
    tasks earlier in the global order (acyclic; a `then` counter counts as signalled by the
    last task in that order that signals the completed counter)."""
    c, tasks = plan.config, plan.tasks
    seen = sorted(i for q in plan.queues for i in q)
    if seen != list(range(len(tasks))):
        raise PlanError("the queues do not hold every task exactly once")
    if any(t.id != i for i, t in enumerate(tasks)):
        raise PlanError("task ids are not their positions")
    d, hq, hkv = c.head_dim, c.num_heads, c.num_kv_heads
    sizes = {"qkv": (hq + 2 * hkv) * d, "o": c.hidden_size, "gate_up": c.intermediate_size,
             "down": c.hidden_size, "lm_head": c.vocab_size}
    for layer in [*range(c.num_layers), -1]:
        for kind in GEMM_KINDS:
            if (kind == "lm_head") != (layer == -1):
                continue
            spans = sorted((t.lo, t.hi) for t in tasks if t.kind == kind and t.layer == layer)
            pos = 0
            for lo, hi in spans:
                if lo != pos or hi <= lo:
                    raise PlanError(f"{kind} of layer {layer}: rows {lo}..{hi} after {pos}")
                pos = hi
            if pos != sizes[kind]:
                raise PlanError(f"{kind} of layer {layer}: {pos} of {sizes[kind]} rows")
        if layer < 0:
            continue
        keys = sorted((t.head, t.split) for t in tasks if t.kind == "attn" and t.layer == layer)
        if keys != [(g, s) for g in range(hkv) for s in range(plan.splits)]:
            raise PlanError(f"attn tasks of layer {layer}: {keys}")
    final = plan.final_counts()
    count_so_far = [0] * len(final)
    for t in tasks:
        for cnt, need in t.waits:
            if need != final[cnt] or count_so_far[cnt] != final[cnt]:
                raise PlanError(f"task {t.id} ({t.kind}, layer {t.layer}) waits for "
                                f"{plan.counter_names[cnt]} = {need}; it reaches {final[cnt]}, "
                                f"{count_so_far[cnt]} of it from earlier tasks")
        for cnt in t.signals:
            count_so_far[cnt] += 1
        if t.then and count_so_far[t.signals[0]] == final[t.signals[0]]:
            for cnt in t.then:
                count_so_far[cnt] += 1


def simulate(plan: RoundPlan, rounds: int = 2, reset: bool = True) -> list[int]:
    """Run the queues as resident workers would, for `rounds` rounds: each step, every
    worker whose next task's waits hold on the counters completes it. The counters persist
    across rounds; with `reset` the last worker zeroes them at the end of a round (the
    kernel's rule). Returns the completion order of the first round.

    PlanError on a deadlock, on counters that do not end a round at their final counts, or on
    a task that starts before the tasks of its own round that it waits for have finished
    (what stale counters allow without the reset)."""
    final = plan.final_counts()
    order: list[int] = []
    counts = [0] * len(final)
    for r in range(rounds):
        fresh = [0] * len(final)  # this round's signals only
        heads = [0] * plan.workers
        done = 0
        while done < len(plan.tasks):
            ready = []
            for w, q in enumerate(plan.queues):
                if heads[w] < len(q):
                    t = plan.tasks[q[heads[w]]]
                    if all(counts[cnt] >= need for cnt, need in t.waits):
                        ready.append((w, t))
            if not ready:
                stuck = [plan.tasks[q[heads[w]]] for w, q in enumerate(plan.queues)
                         if heads[w] < len(q)]
                raise PlanError(f"deadlock in round {r}: {len(stuck)} workers wait, first "
                                f"{stuck[0].kind} of layer {stuck[0].layer}")
            for _, t in ready:
                if any(fresh[cnt] < need for cnt, need in t.waits):
                    raise PlanError(f"round {r}: task {t.id} ({t.kind}, layer {t.layer}) "
                                    f"started on an earlier round's counts")
            for w, t in ready:  # the step's tasks complete together
                for cnt in t.signals:
                    counts[cnt] += 1
                    fresh[cnt] += 1
                if t.then and counts[t.signals[0]] == final[t.signals[0]]:
                    for cnt in t.then:  # this task completed the count: its further work
                        counts[cnt] += 1
                        fresh[cnt] += 1
                heads[w] += 1
                done += 1
                if r == 0:
                    order.append(t.id)
        if fresh != final:
            raise PlanError(f"round {r}: the counters did not reach their final counts")
        if reset:
            counts = [0] * len(final)
    return order
