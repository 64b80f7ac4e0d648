"""Fill a model built on the meta device: from safetensors (mmap, one copy) or seeded random.

A parameter maps to one checkpoint tensor of the same name, except stacked MoE experts
(`...mlp.experts.w13` [E, 2I, H]), which gather `...mlp.experts.{e}.gate_proj.weight` and
`...up_proj.weight` (`StackedExperts.checkpoint_parts`), and merged projections
(`MergedLinear`, e.g. `...self_attn.qkv_proj.weight`), whose row ranges are filled by
`...self_attn.q_proj.weight`, `...k_proj.weight`, `...v_proj.weight`.

Quantised modules (`dlrt.layers.quant.convert`) read each part's format tensors instead (e.g.
`...q_proj.weight` float8_e4m3fn and `...q_proj.weight_scale_inv`), placed in the held layout
(`QuantFormat.expand`). With online quantisation the checkpoint holds the unquantised
`<part>.weight` and every format tensor is made from it by `QuantFormat.quantize`: the same
function `make_checkpoint` writes quantised checkpoints with, so both load the same bits.
KV-cache scales (`...self_attn.k_scale` / `v_scale`) are not weights: `checkpoint.kv_scales`
reads them for an FP8 KV cache.

Experts stored stacked (`StackedExperts.stacked`: `...experts.gate_up_proj` [E, 2I, H],
`...experts.down_proj` [E, H, I], DiffusionGemma) fill w13 / w2 whole. Quantised, they read a
quantised checkpoint's tensors per expert and part as other experts do (`...experts.{e}.
gate_proj.weight` and its scale: the layout of the published quantised checkpoints), and
online quantisation quantises each expert's gate, up and down rows of the stacked tensors
(`WeightSpec.source_index`), so both hold the same bits. A model's
`checkpoint_skips` (name prefixes, e.g. DiffusionGemma's vision tower) are the checkpoint
tensors of parts it does not serve: skipped, with one log line, not reported as unused.

Tensor parallelism: a parameter with a `Shard` (`module.shards`, `dlrt.layers.shard`) holds
one rank's piece of its checkpoint tensors; only that piece is read (`get_slice`), and dummy
weights are the same piece of the full seeded tensor.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dlrt import progress
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.kv_scales import is_kv_scale
from dlrt.errors import CheckpointError
from dlrt.layers.linear import MergedLinear
from dlrt.layers.moe import StackedExperts
from dlrt.layers.quant import QuantFormat, expand_rows
from dlrt.layers.shard import Shard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightSpec:
    """Checkpoint tensor `key` (of `shape`) fills `param[index]` (or the whole `param` when
    index is None): a row range of a merged projection (slice) or of one stacked expert
    ((e, slice)).

    Sharded parameters: `src` indexes the checkpoint tensor (of `full_shape`) and `shape` is
    the piece's. Quantised tensors: `dtype` is the format's stored dtype, `expand` the held
    rows per stored row (0: a scalar for all rows). Online quantisation: `source` is the unquantised
    checkpoint tensor (of `source_shape`) that `fmt.quantize` turns into `key`'s value, or
    its piece `source_index` ((expert, rows) of stacked experts: one expert's part).
    """

    key: str
    param: str
    index: slice | tuple[int, slice] | None
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    expand: int = 1
    source: str | None = None
    source_shape: tuple[int, ...] | None = None
    fmt: QuantFormat | None = None
    src: tuple[slice, ...] | None = None  # a rank's piece of the checkpoint tensor (`Shard`)
    full_shape: tuple[int, ...] | None = None  # the checkpoint tensor's shape when `src`
    source_index: tuple[int, slice] | None = None  # the piece of `source` quantised

    @property
    def suffix(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def read_key(self) -> str:
        """The checkpoint tensor actually read."""
        return self.source or self.key

    @property
    def made_from(self) -> tuple:
        """What online quantisation quantises for this tensor, hashable: (source, expert,
        first row, end row) or (source,)."""
        if self.source_index is None:
            return (self.source,)
        e, rows = self.source_index
        return self.source, e, rows.start, rows.stop


def _weight_parts(module: nn.Module, owner: str, weight: str, rows: int
                  ) -> list[tuple[str, slice | tuple[int, slice] | None, int]]:
    """(checkpoint module name, index in the parameter, rows) of each part of a weight."""
    if isinstance(module, MergedLinear):
        parent = owner.rpartition(".")[0]
        return [(f"{parent}.{part}", slice(lo, hi), hi - lo) for part, lo, hi in module.ranges()]
    if isinstance(module, StackedExperts):
        return [(f"{owner}.{e}.{part.removesuffix('.weight')}", (e, r), r.stop - r.start)
                for e in range(module.num_experts)
                for part, r in module.checkpoint_parts(weight)]
    return [(owner, None, rows)]


def _held_rows(index, rb: int):
    """A weight-row index in held rows (`QuantFormat.row_block`)."""
    if rb == 1 or index is None:
        return index
    e, rows = index if isinstance(index, tuple) else (None, index)
    rows = slice(rows.start // rb, -(-rows.stop // rb))
    return rows if e is None else (e, rows)


def _read_stacked(module: nn.Module, owner: str, stacked: frozenset[str]) -> bool:
    """Whether `module` is experts read from stacked checkpoint tensors (`StackedExperts.
    STACKED`): stored so (`module.stacked`), or named in `stacked`."""
    return isinstance(module, StackedExperts) and (module.stacked or owner in stacked)


def _online_source(module: nn.Module, owner: str, weight: str, stem: str, index, n: int,
                   k: int, stacked: frozenset[str] = frozenset()) -> dict:
    """The unquantised checkpoint tensor a quantised part is made from: `<stem>.weight` [n, k],
    or for experts read stacked the part's rows of the layer's stacked tensor."""
    if _read_stacked(module, owner, stacked):
        rows, cols = (2 * module.intermediate, module.hidden) if weight == "w13" \
            else (module.hidden, module.intermediate)
        full = (module.num_experts, rows, cols)
        return dict(source=f"{owner}.{StackedExperts.STACKED[weight]}", source_shape=full,
                    source_index=index)
    return dict(source=f"{stem}.weight", source_shape=(n, k))


def _quant_specs(module: nn.Module, owner: str, leaf: str, name: str,
                 online: bool, stacked: frozenset[str] = frozenset()) -> list[WeightSpec]:
    fmt = module.quant_format
    weight, suffix = module.quant_params[leaf]
    k = module.quant_cols[weight]
    rb = fmt.row_block.get(suffix, 1)
    specs = []
    for stem, index, n in _weight_parts(module, owner, weight, getattr(module, "out_features", 0)):
        shape, dtype = fmt.stored(suffix, n, k)
        src = dict(fmt=fmt, **_online_source(module, owner, weight, stem, index, n, k,
                                             stacked)) if online else {}
        specs.append(WeightSpec(f"{stem}.{suffix}", name, _held_rows(index, rb), shape, dtype,
                                fmt.expand[suffix], **src))
    return specs


def weight_specs(model: nn.Module, online: bool = False,
                 stacked: frozenset[str] = frozenset()) -> list[WeightSpec]:
    """Every checkpoint tensor the model needs, in parameter order. `online`: quantised
    modules read their unquantised checkpoint weights (`WeightSpec.source`). `stacked`: names
    of expert modules read from stacked tensors (`StackedExperts.STACKED`, as transformers'
    fused experts hold them) although their checkpoint stores one tensor per expert and part
    (unquantised, or `online`)."""
    modules = dict(model.named_modules())
    specs = []
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        module = modules[owner]
        if getattr(module, "quant_format", None) is not None and leaf in module.quant_params:
            specs += _quant_specs(module, owner, leaf, name, online, stacked)
        elif isinstance(module, MergedLinear):
            parent = owner.rpartition(".")[0]
            shard = getattr(module, "shards", {}).get(leaf)
            for part, lo, hi in module.ranges():
                specs.append(_cut(WeightSpec(f"{parent}.{part}.{leaf}", name, slice(lo, hi),
                                             (hi - lo, *p.shape[1:])), shard))
        elif _read_stacked(module, owner, stacked):
            specs.append(_stacked(module, owner, leaf, name, tuple(p.shape)))
        elif isinstance(module, StackedExperts):
            first = module.first_expert
            for e in range(p.shape[0]):
                for part, rows in module.checkpoint_parts(leaf):
                    specs.append(WeightSpec(f"{owner}.{first + e}.{part}", name, (e, rows),
                                            (rows.stop - rows.start, *p.shape[2:])))
        else:
            shard = getattr(module, "shards", {}).get(leaf)
            if shard is not None and shard.groups:
                specs += _grouped(name, tuple(p.shape), shard)
            else:
                specs.append(_cut(WeightSpec(name, name, None, tuple(p.shape)), shard))
    return specs


def _stacked(module: StackedExperts, owner: str, leaf: str, name: str,
             shape: tuple[int, ...]) -> WeightSpec:
    """The spec of a weight of stacked experts: one checkpoint tensor over all the layer's
    experts (`StackedExperts.STACKED`), of which the rank's experts are read."""
    key = f"{owner}.{StackedExperts.STACKED[leaf]}"
    if module.num_experts == module.total_experts:
        return WeightSpec(key, name, None, shape)
    first = module.first_expert
    return WeightSpec(key, name, None, shape, src=(slice(first, first + shape[0]),),
                      full_shape=(module.total_experts, *shape[1:]))


def _cut(spec: WeightSpec, shard: Shard | None) -> WeightSpec:
    """The spec reading `shard`'s piece of its checkpoint tensor (unchanged without one)."""
    if shard is None:
        return spec
    full = list(spec.shape)
    full[shard.dim] *= shard.size
    return dataclasses.replace(spec, key=shard.key or spec.key, src=shard.source(tuple(full)),
                               full_shape=tuple(full))


def _grouped(name: str, shape: tuple[int, ...], shard: Shard) -> list[WeightSpec]:
    """One spec per row group of a fused checkpoint tensor, each reading the rank's rows of
    its group (LLaDA2's query_key_value: q, k, v)."""
    full = (sum(shard.groups), *shape[1:])
    specs, here, there = [], 0, 0
    for rows in shard.groups:
        piece = shard.piece(rows)
        n = piece.stop - piece.start
        specs.append(WeightSpec(shard.key or name, name, slice(here, here + n), (n, *shape[1:]),
                                src=(slice(there + piece.start, there + piece.stop),),
                                full_shape=full))
        here, there = here + n, there + rows
    return specs


def materialize(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Replace meta parameters by uninitialised tensors on `device` (ties kept); move buffers.
    Parameters a module names in its `fp32_params` (a router's) are fp32 whatever `dtype`;
    those in its `param_dtypes` (quantised formats) keep the dtype given there."""
    done: dict[int, nn.Parameter] = {}
    for module in model.modules():
        fp32 = getattr(module, "fp32_params", ())
        fixed = getattr(module, "param_dtypes", {})
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                t = torch.float32 if name in fp32 else fixed.get(name, dtype)
                done[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=t, device=device),
                                           requires_grad=False)
            module._parameters[name] = done[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.to(device)


def load_safetensors(model: nn.Module, folder: CheckpointFolder, online: bool = False) -> None:
    """Copy checkpoint tensors into the (materialised) parameters of `model`; `online`:
    quantise the unquantised weights of quantised modules as they are read.

    Raises:
        CheckpointError: a tensor is missing (a quantised module's scale included), its shape
            differs from the model's, a quantised weight is stored in another dtype than its
            format's, or a safetensors file is unreadable (truncated, corrupt).
    """
    from safetensors import SafetensorError

    params = dict(model.named_parameters())
    specs = weight_specs(model, online)
    missing = list(dict.fromkeys(s.read_key for s in specs if s.read_key not in
                                 folder.tensor_files))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        gone = set(missing)  # the hint names quantised modules' scales only
        scales = [s.key for s in specs if s.key in gone and s.dtype is not None
                  and s.source is None and s.suffix != "weight"]
        hint = (f"; quantised layers lack their scales (e.g. {scales[0]}): the checkpoint does "
                "not match its quantization config. Re-export it with every scale (NVFP4: "
                "weight_scale and the global weight_scale_2), or list modules stored "
                "unquantised in modules_to_not_convert (FP8) / exclude_modules (NVFP4) / "
                "ignore (compressed-tensors)"
                ) if scales else ""
        raise CheckpointError(f"checkpoint {folder.path} lacks tensor(s) {missing[:5]}{more}"
                              f"{hint}")
    by_file: dict[Path, list[WeightSpec]] = defaultdict(list)
    for s in specs:
        by_file[folder.tensor_files[s.read_key]].append(s)
    with progress.bar(len(specs), f"loading {folder.path.name}") as shown:
        for path, file_specs in by_file.items():
            try:
                _load_file(params, path, file_specs, shown.update)
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"cannot read {path} (truncated or corrupt?): {e}") from e
    unused = set(folder.tensor_files) - {s.read_key for s in specs}
    activation = {k for k in unused if k.endswith(".input_scale")}
    if activation:
        log.info("ignored %d static activation scale(s) (input_scale): activations stay in the "
                 "model dtype or are quantised at run time (fp8_activations)", len(activation))
    kv = {k for k in unused if is_kv_scale(k)}  # the KV cache's (`checkpoint.kv_scales`)
    others = other_ranks_experts(model, unused)  # expert parallel: other ranks read them
    skips = tuple(getattr(model, "checkpoint_skips", ()))
    skipped = {k for k in unused if skips and k.startswith(skips)}
    if skipped:
        log.info("skipped %d checkpoint tensor(s) of parts the model does not serve (%s)",
                 len(skipped), ", ".join(p.rstrip(".") for p in skips))
    if unused - activation - kv - others - skipped:
        left = unused - activation - kv - others - skipped
        log.warning("ignored %d checkpoint tensor(s) the model does not use, e.g. %s",
                    len(left), sorted(left)[:3])


def other_ranks_experts(model: nn.Module, keys: set[str]) -> set[str]:
    """The keys among `keys` of experts that other ranks hold (expert parallelism)."""
    prefixes = tuple(f"{name}.{e}." for name, m in model.named_modules()
                     if isinstance(m, StackedExperts) for e in range(m.total_experts)
                     if not m.first_expert <= e < m.first_expert + m.num_experts)
    return {k for k in keys if k.startswith(prefixes)} if prefixes else set()


def _shape_ok(spec: WeightSpec, shape: tuple[int, ...]) -> bool:
    if spec.expand == 0:  # a per-tensor scalar: [] or [1]
        return shape in ((), (1,))
    return shape == spec.shape


def place(param: torch.Tensor, spec: WeightSpec, value: torch.Tensor) -> None:
    """Copy a checkpoint tensor (stored layout) into its place in the parameter."""
    dst = param if spec.index is None else param[spec.index]
    dst.copy_(expand_rows(value, spec.expand, dst.shape[0] if dst.dim() else 1))


class _Quantized:
    """Online quantisation of the tensors of one file: each source (or piece of one, stacked
    experts) quantised once, kept until every tensor made from it has been taken."""

    def __init__(self, specs: list[WeightSpec]):
        self.left = defaultdict(int)
        for s in specs:
            if s.source:
                self.left[s.made_from] += 1
        self.made: dict[tuple, dict[str, torch.Tensor]] = {}

    def take(self, spec: WeightSpec, f) -> torch.Tensor:
        """`spec`'s tensor, made from its source in the open safetensors file `f`."""
        key = spec.made_from
        if key not in self.made:
            value = f.get_tensor(spec.source) if spec.source_index is None \
                else f.get_slice(spec.source)[spec.source_index]
            self.made[key] = spec.fmt.quantize(value)
        value = self.made[key][spec.suffix]
        self.left[key] -= 1
        if not self.left[key]:
            del self.made[key]
        return value


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def dtype_problem(spec: WeightSpec, dtype: torch.dtype, where: str,
                  param_dtype: torch.dtype) -> str | None:
    """Why a tensor of `dtype` (in `where`) cannot fill `spec` of a parameter of
    `param_dtype`, or None when it can (a floating-point value of another width is cast)."""
    if spec.dtype is None and dtype in _FLOAT8:  # codes without their scale
        return (f"tensor {spec.key} in {where} is {dtype} (quantised), but "
                "dlrt holds its module unquantised (a router, an embedding, a "
                "norm, or a module the quantization config leaves unquantised): "
                "dlrt does not read quantised routers or embeddings; list the "
                "module in the config's not-convert list only where the "
                "checkpoint stores it unquantised")
    if spec.source and not (dtype.is_floating_point and dtype not in _FLOAT8):
        return (f"tensor {spec.read_key} in {where} is {dtype}: it is quantised while loading "
                "and must hold floating-point values in a precision above FP8")
    if spec.dtype is not None and not spec.source and dtype != spec.dtype \
            and not (spec.dtype == torch.float32 and dtype.is_floating_point
                     and dtype.itemsize >= 2):  # fp32 scales in another float: converted
        return (f"tensor {spec.key} in {where} is {dtype}, but its layer is "
                f"quantised and the format stores {spec.dtype}: if the module is "
                "stored unquantised, list it in the quantization config's "
                "modules_to_not_convert (FP8) / exclude_modules (NVFP4) / ignore "
                "(compressed-tensors)")
    if param_dtype.is_floating_point and not dtype.is_floating_point:
        return (f"tensor {spec.read_key} in {where} is {dtype}: "
                "the model expects floating-point values")
    return None


def shape_problem(spec: WeightSpec, shape: tuple[int, ...], where: str) -> str | None:
    """Why a tensor of `shape` (in `where`) cannot fill `spec`, or None when it can."""
    want = spec.source_shape if spec.source else spec.full_shape or spec.shape
    if shape == want if spec.source or spec.src else _shape_ok(spec, shape):
        return None
    return f"tensor {spec.read_key} in {where} has shape {list(shape)}, the model expects " \
           f"{list(want)}"


def fill(params: dict[str, nn.Parameter], f, specs: list[WeightSpec], where: str,
         done=lambda n: None) -> None:
    """Copy the tensors of `specs` from `f` into their parameters (`place`), checking each
    one's shape first, and the dtype of those copied as read; online specs are quantised
    from their sources, each source once. `f` reads tensors as an open safetensors file
    does: `get_slice(name)` (with `get_shape()` and indexing) and `get_tensor(name)`;
    `where` names it in errors.

    Raises:
        CheckpointError: a tensor of the wrong shape or dtype (`shape_problem`,
            `dtype_problem`).
    """
    quantized = _Quantized(specs)
    for s in specs:
        problem = shape_problem(s, tuple(f.get_slice(s.read_key).get_shape()), where)
        if problem:
            raise CheckpointError(problem)
        if s.source:
            value = quantized.take(s, f)
        elif s.src is not None:  # this rank's piece only
            value = f.get_slice(s.key)[s.src]
        else:
            value = f.get_tensor(s.key)
        dst = params[s.param].data
        problem = None if s.source else dtype_problem(s, value.dtype, where, dst.dtype)
        if problem:
            raise CheckpointError(problem)
        place(dst, s, value)
        done(1)


def _load_file(params: dict[str, nn.Parameter], path: Path, specs: list[WeightSpec],
               done=lambda n: None) -> None:
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        fill(params, f, specs, path.name, done)


def tensor_seed(seed: int, key: str) -> int:
    """Seed of one tensor: independent of shard layout and loading order."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63)


# Checkpoint tensors (by last name) stored in fp32 whatever the model dtype, and the 1-D
# tensors that are not norm weights: LLaDA2's router bias `<mlp>.gate.expert_bias` [E].
FP32_TENSORS = ("expert_bias",)


def stored_dtype(key: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a checkpoint holds tensor `key` in when its weights are in `dtype`."""
    return torch.float32 if key.rpartition(".")[2] in FP32_TENSORS else dtype


def random_tensor(spec: WeightSpec, seed: int, std: float, dtype: torch.dtype,
                  device: torch.device | str) -> torch.Tensor:
    """The seeded random value of one checkpoint tensor: norms (1-D) are ones, the rest
    (router biases included: a uniform bias would change no choice) normal(0, std), drawn in
    fp32 on `device` and cast to `dtype`."""
    if len(spec.shape) == 1 and spec.key.rpartition(".")[2] not in FP32_TENSORS:
        return torch.ones(spec.shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, spec.key))
    t = torch.empty(spec.shape, dtype=torch.float32, device=device)
    return t.normal_(0.0, std, generator=gen).to(dtype)


def spec_value(spec: WeightSpec, seed: int, std: float, dtype: torch.dtype,
               device: torch.device | str, sources: dict | None = None) -> torch.Tensor:
    """The seeded value of a checkpoint tensor in its stored layout: `random_tensor` in
    `dtype`, or for a quantised tensor the format's quantisation of its source's value (of
    its piece, `source_index`). `sources`: a dict the caller keeps across calls, holding the
    last source drawn (stacked experts: drawn once for all their pieces in a row)."""
    if spec.src is not None:  # a rank's piece of the full seeded tensor
        full = dataclasses.replace(spec, shape=spec.full_shape, src=None, full_shape=None)
        return random_tensor(full, seed, std, spec.dtype or dtype, device)[spec.src]
    if spec.source is None:
        return random_tensor(spec, seed, std, spec.dtype or dtype, device)
    key = (spec.source, seed, std, dtype, str(device))
    value = sources.get(key) if sources is not None else None
    if value is None:
        source = WeightSpec(spec.source, spec.param, None, spec.source_shape)
        value = random_tensor(source, seed, std, dtype, device)
        if sources is not None:
            sources.clear()
            sources[key] = value
    if spec.source_index is not None:
        value = value[spec.source_index]
    return spec.fmt.quantize(value)[spec.suffix]


def init_dummy(model: nn.Module, seed: int, std: float, dtype: torch.dtype | None = None
               ) -> None:
    """Fill materialised parameters with the values `make_checkpoint` would write (quantised
    modules: the quantisation of weights drawn in `dtype`, default the model's first
    parameter's dtype)."""
    params = dict(model.named_parameters())
    dtype = dtype or next(iter(params.values())).dtype
    sources: dict = {}
    for s in weight_specs(model, online=True):
        dst = params[s.param].data
        place(dst, s, spec_value(s, seed, std, dst.dtype if s.source is None else dtype,
                                 dst.device, sources))
