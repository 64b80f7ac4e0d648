"""The persistent round's plan (`dlrt.runtime.persistent`): coverage, counters, deadlock
freedom, the counters' reset between rounds, and the plan run task by task in PyTorch against
the layer-by-layer forward (fp32, CPU; tolerance: relative error 1e-5 of the logits, the split
softmax's fp32 summation order, and 1e-6 of the K/V the round writes into the cache: a
projection's row tile may sum in another order than the whole GEMM)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.sdpa import SDPABackend
from dlrt.checkpoint.presets import preset
from dlrt.models.sdar.config import sdar_config
from dlrt.models.sdar.model import SDARForCausalLM
from dlrt.ops import get_ops
from dlrt.resources import data_path
from dlrt.runtime.persistent.interpret import run_plan
from dlrt.runtime.persistent.plan import (
    PlanError,
    RoundPlan,
    build_plan,
    check_plan,
    simulate,
)
from dlrt.runtime.runner import ModelRunner


def tiny(**over):
    hf = preset("tiny-sdar")[0]
    hf.update(over)
    return sdar_config(hf, "sdar")


# head counts that group by 3, a hidden size and intermediate size off every tile multiple
AWKWARD = dict(hidden_size=80, intermediate_size=72, num_attention_heads=6,
               num_key_value_heads=2, head_dim=16, vocab_size=1000, mask_token_id=999,
               bos_token_id=998, eos_token_id=998, num_hidden_layers=3)


def real(name: str):
    hf = json.loads((data_path("configs") / name / "config.json").read_text())
    return sdar_config(hf, hf["model_type"])


@pytest.mark.parametrize("name,workers,splits", [("SDAR-1.7B-Chat", 132, 4),
                                                 ("SDAR-8B-Chat", 132, 16)])
def test_real_configs_plan(name, workers, splits):
    c = real(name)
    plan = build_plan(c, 4, workers, splits)
    check_plan(plan)
    order = simulate(plan)
    assert sorted(order) == list(range(len(plan.tasks)))
    per_layer = {k: sum(1 for t in plan.tasks if t.kind == k and t.layer == 0)
                 for k in ("qkv", "attn", "o", "gate_up", "down")}
    assert sum(per_layer.values()) == sum(1 for t in plan.tasks if t.layer == 0)
    assert per_layer["attn"] == c.num_kv_heads * splits
    # five dependent steps a layer: the o tiles wait for the heads merged by attention tasks
    o = next(t for t in plan.tasks if t.kind == "o" and t.layer == 0)
    assert [plan.counter_names[cnt] for cnt, _ in o.waits] == ["merged[0]"]
    assert plan.final_counts()[o.waits[0][0]] == c.num_kv_heads
    assert all(per_layer[k] >= workers // 2 for k in ("qkv", "o", "gate_up", "down"))
    # the weight bytes spread evenly: no worker streams 15% more than the mean
    load = [sum(plan.tasks[i].weight_bytes for i in q) for q in plan.queues]
    assert max(load) < 1.15 * sum(load) / len(load)
    # each layer's attention tasks on as many workers as there are tasks (up to all)
    worker = {i: w for w, q in enumerate(plan.queues) for i in q}
    for layer in range(c.num_layers):
        attn = [t.id for t in plan.tasks if t.kind == "attn" and t.layer == layer]
        assert len({worker[i] for i in attn}) == min(workers, len(attn))


@pytest.mark.parametrize("over,block,workers,splits", [({}, 4, 8, 3), (AWKWARD, 4, 5, 2),
                                                       (AWKWARD, 1, 1, 1), (AWKWARD, 7, 64, 8)])
def test_small_plans(over, block, workers, splits):
    plan = build_plan(tiny(**over), block, workers, splits)
    check_plan(plan)
    simulate(plan, rounds=3)


def _replace(plan: RoundPlan, tasks) -> RoundPlan:
    return dataclasses.replace(plan, tasks=tasks)


def test_check_plan_finds_holes_repeats_and_bad_counts():
    plan = build_plan(tiny(**AWKWARD), 4, 4, 2)
    t = plan.tasks
    o = next(i for i, x in enumerate(t) if x.kind == "o" and x.hi - x.lo > 1)
    short = dataclasses.replace(t[o], hi=t[o].hi - 1)
    with pytest.raises(PlanError, match="rows"):
        check_plan(_replace(plan, t[:o] + [short] + t[o + 1:]))
    attn = next(i for i, x in enumerate(t) if x.kind == "attn")
    (cnt, need), = t[attn].waits
    with pytest.raises(PlanError, match="waits for"):
        check_plan(_replace(plan, t[:attn] + [dataclasses.replace(t[attn],
                                                                  waits=((cnt, need - 1),))]
                            + t[attn + 1:]))
    with pytest.raises(PlanError, match="exactly once"):
        check_plan(dataclasses.replace(plan, queues=[plan.queues[0] * 2] + plan.queues[1:]))
    with pytest.raises(PlanError, match="attn tasks"):
        check_plan(_replace(plan, t[:attn] + [dataclasses.replace(t[attn], head=5)]
                            + t[attn + 1:]))
    # without the merge's `then`, the o tiles wait for a count never reached
    no_merge = [dataclasses.replace(x, then=()) if x.kind == "attn" else x for x in t]
    with pytest.raises(PlanError, match="merged"):
        check_plan(_replace(plan, no_merge))
    with pytest.raises(PlanError, match="deadlock"):
        simulate(_replace(plan, no_merge))


def test_deadlock_and_stale_counters_are_found():
    plan = build_plan(tiny(), 4, 2, 2)
    with pytest.raises(PlanError, match="deadlock"):  # worker 0 runs the lm_head first
        simulate(dataclasses.replace(plan, queues=[[len(plan.tasks) - 1] + [
            i for q in plan.queues for i in q if i != len(plan.tasks) - 1]]))
    plan = build_plan(tiny(), 4, 8, 3)  # enough workers that a task can run ahead
    simulate(plan, rounds=2, reset=True)
    with pytest.raises(PlanError, match="earlier round"):
        simulate(plan, rounds=2, reset=False)


def test_moe_models_keep_the_layer_path():
    hf = preset("tiny-sdar-moe")[0]
    with pytest.raises(ValueError, match="dense"):
        build_plan(sdar_config(hf, "sdar_moe"), 4, 8)


def _model(config, seed):
    torch.manual_seed(seed)
    model = SDARForCausalLM(config, get_ops("reference"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" in name else 0.08) +
                    (1.0 if "norm" in name else 0.0))
    return model.eval()


@pytest.mark.parametrize("over,block,context,splits", [({}, 4, 0, 2), (AWKWARD, 4, 1, 3),
                                                       (AWKWARD, 4, 13, 4), (AWKWARD, 5, 37, 8),
                                                       (AWKWARD, 2, 6, 1)])
def test_plan_run_equals_layer_forward(over, block, context, splits):
    config = tiny(**over)
    model = _model(config, seed=context)
    ops = get_ops("reference")
    caches = [PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim, 128,
                           torch.float32, "cpu") for _ in range(2)]
    runner = ModelRunner(model, ops, SDPABackend(caches[0], config.num_heads), caches[0],
                         torch.device("cpu"))
    gen = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, config.vocab_size, (context,), generator=gen)
    if context:
        runner.forward_at(prompt, 0, block, rows=None)
        for name in ("k", "v"):
            getattr(caches[1], name).copy_(getattr(caches[0], name))
    tokens = torch.randint(0, config.vocab_size, (block,), generator=gen)
    lens = torch.tensor([context, context + block], dtype=torch.int32)
    want = runner.forward(tokens, lens, block, rows=slice(None))
    plan = build_plan(config, block, workers=3, splits=splits)
    got = run_plan(plan, model, caches[1], tokens, lens, block)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-5, err
    for a, b in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):
        assert ((a - b).norm() / a.norm()).item() < 1e-6


def test_plan_run_reads_an_fp8_cache():
    """An FP8 KV cache: the block's K/V quantised with the layer's scales, bit for bit as the
    layer path writes them (the same projections' tiles aside: compared through the logits)."""
    config = tiny(**AWKWARD)
    model = _model(config, seed=5)
    scales = torch.full((config.num_layers,), 0.05)
    caches = [PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim, 64,
                           torch.float8_e4m3fn, "cpu", k_scale=scales.clone(),
                           v_scale=scales.clone()) for _ in range(2)]
    runner = ModelRunner(model, get_ops("reference"),
                         SDPABackend(caches[0], config.num_heads), caches[0],
                         torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    runner.forward_at(torch.randint(0, config.vocab_size, (11,), generator=gen), 0, 4,
                      rows=None)
    for name in ("k", "v"):
        getattr(caches[1], name).copy_(getattr(caches[0], name))
    tokens = torch.randint(0, config.vocab_size, (4,), generator=gen)
    lens = torch.tensor([11, 15], dtype=torch.int32)
    want = runner.forward(tokens, lens, 4, rows=slice(None))
    got = run_plan(build_plan(config, 4, 3, 2), model, caches[1], tokens, lens, 4)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-5, err
    differ = (caches[0].k.view(torch.uint8) != caches[1].k.view(torch.uint8)).sum()
    assert differ <= 2, differ  # a K value on a rounding boundary may flip one code


def test_run_plan_checks_the_block():
    config = tiny()
    plan = build_plan(config, 4, 2)
    cache = PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim, 16,
                         torch.float32, "cpu")
    with pytest.raises(ValueError, match="plan of block 4"):
        run_plan(plan, _model(config, 0), cache, torch.zeros(3, dtype=torch.long),
                 torch.tensor([0, 3], dtype=torch.int32), 4)


def test_timeline_summary():
    from dlrt.runtime.persistent.kernel import timeline_summary

    plan = build_plan(tiny(), 4, 2, 2)
    stamps = torch.zeros(len(plan.tasks), 3, dtype=torch.int64)
    for w, q in enumerate(plan.queues):  # worker w: each task waits w us, then runs 2 us
        t0 = 0
        for i in q:
            stamps[i] = torch.tensor([t0, t0 + 1000 * w, t0 + 1000 * w + 2000])
            t0 = int(stamps[i, 2])
    s = timeline_summary(plan, stamps)
    assert s["busy_us"] == [2.0 * len(q) for q in plan.queues]
    assert s["wait_us"] == [1.0 * w * len(q) for w, q in enumerate(plan.queues)]
    assert s["span_us"] == max(3.0 * len(plan.queues[1]), 2.0 * len(plan.queues[0]))
    assert sum(s["busy_by_kind_us"].values()) == 2.0 * len(plan.tasks)
    assert s["mean_page_wait_us"] == 0.0  # three columns: no page ring
    # each projection kind's weight bytes over its busy time per worker (2 us a task)
    for kind, gbps in s["gbps_by_kind"].items():
        tasks = [t for t in plan.tasks if t.kind == kind]
        want = sum(t.weight_bytes for t in tasks) / (2.0 * len(tasks) / 2) / 1e3
        assert gbps == pytest.approx(want)
    assert set(s["gbps_by_kind"]) == {"qkv", "o", "gate_up", "down", "lm_head"}
    # a page column: 0.5 us of every projection task's work waited for pages
    paged = torch.cat([stamps, torch.tensor([[500 if t.weight else 0] for t in plan.tasks])],
                      dim=1)
    s = timeline_summary(plan, paged)
    gemv = sum(1 for t in plan.tasks if t.weight)
    assert s["mean_page_wait_us"] == pytest.approx(0.5 * gemv / 2)
    assert s["page_wait_by_kind_us"]["attn"] == 0.0
    assert sum(s["page_wait_by_kind_us"].values()) == pytest.approx(0.5 * gemv)


def test_timeline_handoff():
    """Stamps of a round run in `simulate` order where every task starts its work exactly
    0.5 us after its dependencies finished (and was picked 1 us before they did): the summary's
    handoff is 0.5 us for every kind that waits."""
    from dlrt.runtime.persistent.kernel import timeline_summary

    plan = build_plan(tiny(**dict(AWKWARD, num_hidden_layers=2)), 4, 3, 2)
    stamps = torch.zeros(len(plan.tasks), 3, dtype=torch.int64)
    done_at = [0] * len(plan.counter_names)
    for i in simulate(plan, rounds=1):
        t = plan.tasks[i]
        ready = max((done_at[c] for c, _ in t.waits), default=0)
        start = ready + 500 if t.waits else 0
        stamps[i] = torch.tensor([ready - 1000, start, start + 2000 + 10 * i])
        for c in (*t.signals, *t.then):  # the merge: done with the head's last split
            done_at[c] = max(done_at[c], int(stamps[i, 2]))
    s = timeline_summary(plan, stamps)
    assert s["handoff_us"] == pytest.approx(0.5)
    assert set(s["handoff_by_kind_us"]) == {t.kind for t in plan.tasks if t.waits}
    assert all(v == pytest.approx(0.5) for v in s["handoff_by_kind_us"].values())
    stamps[:, 1] += 700  # work starting later after the same dependencies: 1.2 us
    assert timeline_summary(plan, stamps)["handoff_us"] == pytest.approx(1.2)


def test_plan_run_with_fp8_weights(tiny_sdar):
    """Weight-only FP8 projections (128 x 128 blocks, quantised while loading): the plan run
    dequantises each weight as the layer path's reference does (code x scale rounded to the
    model dtype), so in fp32 the two agree to the summation order; W8A8 layers are refused."""
    from dlrt import LLM
    from dlrt.layers.quant.fp8 import set_activations

    llm = LLM(tiny_sdar, max_model_len=64, quantization="fp8", fp8_activations="weight_only",
              dtype="float32")
    model, config = llm.model, llm.config
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    caches = [PagedKVCache(config.num_layers, config.num_kv_heads, config.head_dim, 64,
                           torch.float32, "cpu") for _ in range(2)]
    runner = ModelRunner(model, get_ops("reference"), SDPABackend(caches[0], config.num_heads),
                         caches[0], torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    runner.forward_at(torch.randint(0, config.vocab_size, (9,), generator=gen), 0, 4, rows=None)
    for name in ("k", "v"):
        getattr(caches[1], name).copy_(getattr(caches[0], name))
    tokens = torch.randint(0, config.vocab_size, (4,), generator=gen)
    lens = torch.tensor([9, 13], dtype=torch.int32)
    want = runner.forward(tokens, lens, 4, rows=slice(None))
    plan = build_plan(config, 4, workers=3, splits=2, itemsize=1)
    got = run_plan(plan, model, caches[1], tokens, lens, 4)
    # bytes per element by weight: 1 for the FP8 projections, 4 for the fp32 LM head
    sized = build_plan(config, 4, workers=3, splits=2,
                       itemsize=lambda w: model.get_parameter(w).element_size())
    for t in sized.tasks:
        if t.kind in ("down", "lm_head"):
            k = config.intermediate_size if t.kind == "down" else config.hidden_size
            assert t.weight_bytes == (t.hi - t.lo) * k * (4 if t.kind == "lm_head" else 1)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-5, err
    set_activations(model, "dynamic")
    with pytest.raises(ValueError, match="weight-only product"):
        run_plan(plan, model, caches[1], tokens, lens, 4)
