"""Tensor parallelism on the CPU in one process: the ranks are threads whose all-reduce and
all-gather meet at a barrier (`ThreadRanks`), so a cut model's forward and the vocabulary-parallel
candidates are checked against the whole model with fresh inputs; the loader reads only each
rank's slices; sizes that do not split and options that do not fit are named. The same under
torchrun (processes, gloo): `tests/e2e/test_tensor_parallel_torchrun.py`."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from dlrt.attention.kv_cache import PagedKVCache
from dlrt.attention.registry import get_backend
from dlrt.checkpoint.default import default_model_path
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.loader import init_dummy, load_safetensors, materialize
from dlrt.decoding.round import RoundKind, reference_candidates
from dlrt.decoding.sampling import SamplingMode, SamplingSpec
from dlrt.distributed.group import TensorParallel
from dlrt.distributed.transform import check_sizes, shard_model
from dlrt.distributed.vocab import VocabShard
from dlrt.engine.config import EngineConfig
from dlrt.errors import ConfigError, OptionError
from dlrt.layers.shard import Shard
from dlrt.models.registry import build_model, family, model_config
from dlrt.ops import get_ops
from dlrt.runtime.runner import ModelRunner

TOL = 1e-5  # fp32: a cut model's logits against the whole model's (max abs, logits ~0.1-1)


class ThreadRanks:
    """`size` ranks as threads of this process: each collective waits for every rank, then
    every rank computes the same result from the parts in rank order."""

    def __init__(self, size: int):
        self.size = size
        self.parts: list[torch.Tensor | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)

    def rank(self, r: int) -> TensorParallel:
        tp = TensorParallel(r, self.size)
        tp.all_reduce = lambda x: self._meet(r, x, lambda ps: sum(p.float() for p in ps)
                                             .to(x.dtype))
        tp.all_gather = lambda x: self._meet(r, x, lambda ps: torch.cat(ps, dim=-1))
        return tp

    def _meet(self, r: int, x: torch.Tensor, combine) -> torch.Tensor:
        self.barrier.wait()
        self.parts[r] = x.clone()
        self.barrier.wait()
        out = combine(list(self.parts))
        self.barrier.wait()
        return out


def run_ranks(size: int, work) -> list:
    """work(rank, TensorParallel) on `size` threads; their results in rank order."""
    ranks, out, errors = ThreadRanks(size), [None] * size, []

    def one(r: int):
        try:
            out[r] = work(r, ranks.rank(r))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            ranks.barrier.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def _model(path: Path, tp: TensorParallel, dummy: bool = False):
    folder = CheckpointFolder.open(path)
    config = model_config(folder.hf_config)
    ops = get_ops("reference")
    with torch.device("meta"):
        model = build_model(config, ops)
    shard_model(model, config, family(config.family), tp)
    materialize(model, torch.float32, torch.device("cpu"))
    if dummy:
        init_dummy(model, seed=5, std=0.02)
    else:
        load_safetensors(model, folder)
    return model.eval(), config, ops


def _runner(path: Path, tp: TensorParallel) -> ModelRunner:
    model, config, ops = _model(path, tp)
    cache = PagedKVCache(config.num_layers, config.num_kv_heads // tp.size, config.head_dim, 64,
                         torch.float32, "cpu")
    backend = get_backend("sdpa", cache, config.num_heads // tp.size)
    return ModelRunner(model, ops, backend, cache, torch.device("cpu"))


PRESETS = ["tiny_sdar", "tiny_sdar_moe", "tiny_llada", "tiny_llada2"]


@pytest.mark.parametrize("preset,size", [(p, 2) for p in (*PRESETS, "default")]
                         + [("tiny_llada", 4)])  # LLaDA's 4 KV heads split 4 ways
def test_cut_forward_matches_whole_model(preset, size, request):
    """A prefill of 8 tokens then a block of 4 against the cache: every rank's gathered
    logits equal the whole model's (max abs < TOL) and the ranks' logits are bit-identical.
    "default" is the embedded model, whose LM head is tied to the embedding (a rank reads its
    rows of the embedding for its head)."""
    path = default_model_path() if preset == "default" else request.getfixturevalue(preset)
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 1000, (12,), generator=gen)
    chunk = None if preset == "tiny_llada" else 4  # LLaDA: full attention

    def forward(runner: ModelRunner, gather):
        runner.forward_at(ids[:8], 0, chunk)
        return gather(runner.forward_at(ids[8:], 8, chunk))

    whole = forward(_runner(path, TensorParallel(0, 1)), lambda x: x)
    cut = run_ranks(size, lambda r, tp: forward(_runner(path, tp), tp.all_gather))
    assert cut[0].shape == whole.shape
    assert (cut[0] - whole).abs().max().item() < TOL
    assert all(torch.equal(c, cut[0]) for c in cut)
    assert (whole - forward(_runner(path, TensorParallel(0, 1)),
                            lambda x: x.roll(1, 0))).abs().max() > 1e-3  # a real check


@pytest.mark.parametrize("preset", PRESETS)
def test_rank_reads_only_its_slices(preset, request, monkeypatch):
    """Every cut parameter is read through `get_slice` with the rank's index, never whole
    (`get_tensor`), and each cut checkpoint tensor gives rank 1 exactly half its values."""
    import safetensors

    path = request.getfixturevalue(preset)
    real = safetensors.safe_open
    whole_keys, sliced = set(), {}

    class Spy:
        def __init__(self, *a, **kw):
            self.f = real(*a, **kw)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, key):
            whole_keys.add(key)
            return self.f.get_tensor(key)

        def get_slice(self, key):
            inner = self.f.get_slice(key)

            class Slice:
                def get_shape(self):
                    return inner.get_shape()

                def __getitem__(self, index):
                    t = inner[index]
                    sliced[key] = sliced.get(key, 0) + t.numel()
                    return t

            return Slice()

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    model, _, _ = _model(path, TensorParallel(1, 2))
    assert sliced and not set(sliced) & whole_keys
    shapes = {}
    with real(next(Path(path).glob("*.safetensors")), framework="pt") as f:
        for k in f.keys():
            shapes[k] = f.get_slice(k).get_shape()
    for key, n in sliced.items():
        assert n * 2 == torch.Size(shapes[key]).numel(), key  # half of each cut tensor
    # The layers say what they hold: heads and widths halved, experts split.
    sharded = [m for m in model.modules() if getattr(m, "shards", None)]
    assert sharded and all(isinstance(s, Shard) and s.rank == 1 for m in sharded
                           for s in m.shards.values())


@pytest.mark.parametrize("preset", ["tiny_sdar", "tiny_llada2"])
def test_dummy_weights_are_the_pieces_of_the_whole(preset, request):
    """Seeded dummy weights of a rank are its pieces of the whole model's dummy weights: the
    cut forward equals the whole forward with load_format dummy too."""
    path = request.getfixturevalue(preset)
    whole, _, _ = _model(path, TensorParallel(0, 1), dummy=True)
    cut, _, _ = _model(path, TensorParallel(1, 2), dummy=True)
    params = dict(whole.named_parameters())
    for name, p in cut.named_parameters():
        if p.shape != params[name].shape:
            w = params[name]
            dim = next(d for d in range(p.dim()) if p.shape[d] != w.shape[d])
            if name.endswith("w13") or name.endswith("w2"):  # experts 4..7 of 8
                assert torch.equal(p, w[w.shape[0] // 2:]), name
            elif "qkv" in name or "query_key_value" in name or "gate_up" in name:
                continue  # part-wise pieces: covered by the forward tests
            else:
                assert torch.equal(p, w.narrow(dim, p.shape[dim], p.shape[dim])), name


def _greedy_check(logits: torch.Tensor, mask: int, size: int):
    v = logits.shape[1]
    n = v // size
    ref_ids, ref_conf = reference_candidates(logits, SamplingSpec(0.0, 0, 1.0, 0),
                                             SamplingMode(True), 0, torch.arange(4), mask)
    out = run_ranks(size, lambda r, tp: VocabShard(tp, v).greedy(
        logits[:, r * n:(r + 1) * n], None, None, 0, None, mask))
    for ids, conf in out:
        assert torch.equal(ids, ref_ids)
        assert torch.allclose(conf, ref_conf, rtol=1e-5, atol=0)
    return ref_ids


@pytest.mark.parametrize("size", [2, 4])
def test_sharded_greedy_candidates_match_the_reference(size):
    """Greedy candidates from per-shard (max, id, sum of exp) equal the reference's argmax and
    max probability over the whole vocabulary (rtol 1e-5), with the mask token in the last
    shard holding the largest logit of a row (never chosen) and maxima in every shard."""
    gen = torch.Generator().manual_seed(3)
    v = 64
    logits = torch.randn(4, v, generator=gen) * 3
    mask = v - 5
    logits[0, mask] = 50.0  # the mask token's logit is the largest: never a candidate
    for row in range(1, 4):  # the maximum in shard `row % size`
        logits[row, (row % size) * (v // size) + 2] = 20.0 + row
    ids = _greedy_check(logits, mask, size)
    assert ids[0] != mask


def test_vocab_shard_gathers_where_the_strategy_needs_the_distribution():
    """Greedy low-confidence and threshold rounds stay local; sampled, credit and
    entropy-bounded rounds get the gathered logits and the ops table's op."""
    def kinds(r, tp):
        shard = VocabShard(tp, 8)
        x = torch.full((2, 4), float(r))
        out = []
        for kind in (RoundKind("low_confidence", SamplingMode(True)),
                     RoundKind("threshold", SamplingMode(True)),
                     RoundKind("low_confidence", SamplingMode(False)),
                     RoundKind("credit", SamplingMode(True)),
                     RoundKind("entropy_bounded", SamplingMode(True))):
            logits, op = shard.for_round(x, kind, reference_candidates)
            out.append((logits.shape[1], op is reference_candidates))
        return out

    r0, r1 = run_ranks(2, kinds)
    assert r0 == r1 == [(4, False), (4, False), (8, True), (8, True), (8, True)]


def test_sizes_that_do_not_split_are_named(tiny_sdar, tiny_sdar_moe):
    config = model_config(CheckpointFolder.open(tiny_sdar).hf_config)
    with pytest.raises(ConfigError, match="num_attention_heads 4, num_key_value_heads 2"):
        check_sizes(config, 3)
    moe = model_config(CheckpointFolder.open(tiny_sdar_moe).hf_config)
    with pytest.raises(ConfigError, match="num_experts 8"):
        check_sizes(moe, 16)
    check_sizes(config, 2)


def test_tensor_parallel_size_must_match_the_processes(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(OptionError, match="torchrun --nproc-per-node 2"):
        EngineConfig.from_kwargs(tensor_parallel_size=2).resolve_device()
    with pytest.raises(OptionError, match="at least 1"):
        EngineConfig.from_kwargs(tensor_parallel_size=0)
    assert EngineConfig.from_kwargs().resolve_device().tensor_parallel_size == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert EngineConfig.from_kwargs().resolve_device().tensor_parallel_size == 2
    assert EngineConfig.from_kwargs(tensor_parallel_size=1).resolve_device() \
        .tensor_parallel_size == 1
    with pytest.raises(OptionError, match="needs 4 processes"):
        EngineConfig.from_kwargs(tensor_parallel_size=4).resolve_device()


class _SmallReducer:
    """A reducer of `capacity_bytes` over thread ranks that records its message sizes."""

    def __init__(self, tp: TensorParallel, capacity_bytes: int):
        self.tp, self.capacity_bytes, self.sizes = tp, capacity_bytes, []

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        assert x.numel() * x.element_size() <= self.capacity_bytes
        self.sizes.append(x.numel())
        return self.tp.all_reduce(x)


@pytest.mark.parametrize("shape", [(7, 5), (33,), (3, 2, 3)])
def test_reducer_messages_larger_than_its_capacity_go_in_row_chunks(shape):
    """A reducer's sum and gather of tensors past its capacity: chunks of whole rows, the
    same values as the group's collectives."""
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(shape, generator=gen) for _ in range(2)]

    def work(r, tp):
        small = _SmallReducer(tp, capacity_bytes=3 * 5 * 4)
        chunked = TensorParallel(r, 2, reducer=small)
        return (chunked.all_reduce(xs[r]), chunked.all_gather(xs[r]), small.sizes,
                tp.all_reduce(xs[r]), tp.all_gather(xs[r]))

    for red, gat, sizes, want_red, want_gat in run_ranks(2, work):
        assert torch.equal(red, want_red) and torch.equal(gat, want_gat)
        assert len(sizes) > 2  # split
