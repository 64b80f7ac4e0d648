"""Turn a linear layer or a stack of experts, built on the meta device, into one that holds a
quantised format: its weight parameters are replaced by the format's held tensors (meta, with
the format's dtypes), and a linear layer gets the format's `LinearMethod`.

A converted module carries:
  `quant_format`: the `QuantFormat`;
  `quant_params`: parameter name -> (weight it belongs to, checkpoint suffix), e.g. for a
      linear layer {"weight": ("weight", "weight"), "weight_scale_inv": ("weight",
      "weight_scale_inv")}, for experts {"w13": ("w13", "weight"), "w13_weight_scale_inv":
      ("w13", "weight_scale_inv"), ...};
  `quant_cols`: weight -> its K (in features);
  `param_dtypes`: parameter name -> dtype, which `materialize` keeps.
The loader (`dlrt.checkpoint.loader`) maps each held parameter to checkpoint tensors from these.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrt.layers.linear import LinearBase, MergedLinear
from dlrt.layers.moe import StackedExperts
from dlrt.layers.quant import QuantFormat, expand_rows


def param_name(weight: str, suffix: str) -> str:
    """The held parameter of `suffix` for weight `weight` ("weight" / "w13" / "w2")."""
    if suffix == "weight":
        return weight
    return suffix if weight == "weight" else f"{weight}_{suffix}"


def _replace(module: nn.Module, weight: str, lead: tuple[int, ...], n: int, k: int,
             fmt: QuantFormat) -> None:
    fmt.check(n, k)
    for suffix in fmt.suffixes:
        shape, dtype = fmt.held(suffix, n, k)
        name = param_name(weight, suffix)
        module._parameters[name] = nn.Parameter(
            torch.empty((*lead, *shape), dtype=dtype, device="meta"), requires_grad=False)
        module.quant_params[name] = (weight, suffix)
        module.param_dtypes[name] = dtype
    module.quant_cols[weight] = k


def quantize_module(module: nn.Module, fmt: QuantFormat) -> None:
    """Convert a `LinearBase` or `StackedExperts` (on the meta device) to hold `fmt` (the
    variant that fits its parts: `QuantFormat.for_parts`). Experts stored stacked
    (`StackedExperts.stacked`) are held as the others: their checkpoint parts are each expert's
    gate, up and down rows (`dlrt.checkpoint.loader` reads a quantised checkpoint's tensor per
    expert and part, or quantises those rows of the stacked tensors while loading).

    Raises:
        ValueError: the weight's shape does not fit the format (NVFP4: K not a multiple of 16;
            `dlrt.checkpoint.quant.quantize_model` names the module in a CheckpointError).
        TypeError: another kind of module.
    """
    if isinstance(module, MergedLinear):
        fmt = fmt.for_parts([[size for _, size in module.parts]])
    elif isinstance(module, LinearBase):
        fmt = fmt.for_parts([[module.out_features]])
    elif isinstance(module, StackedExperts):
        fmt = fmt.for_parts([[module.intermediate] * 2, [module.hidden]])
    module.quant_format = fmt
    module.quant_params, module.quant_cols, module.param_dtypes = {}, {}, {}
    if isinstance(module, LinearBase):
        _replace(module, "weight", (), module.out_features, module.in_features, fmt)
        module.method = fmt.linear_method()
    elif isinstance(module, StackedExperts):
        e, h, i = module.num_experts, module.hidden, module.intermediate
        _replace(module, "w13", (e,), 2 * i, h, fmt)
        _replace(module, "w2", (e,), h, i, fmt)
    else:
        raise TypeError(f"cannot quantise a {type(module).__name__}")


def quantize_experts(module: StackedExperts, fmt: QuantFormat) -> None:
    """Convert materialised experts to hold `fmt` from their current weights, in place (tests,
    benchmarks): each checkpoint part (gate, up, down of each expert) quantised as a checkpoint
    stores it, then laid out as held (`expand_rows`), on the weights' device."""
    w13, w2 = module.w13.detach(), module.w2.detach()
    i = module.intermediate
    quantize_module(module, fmt)
    fmt = module.quant_format
    held: dict[str, list[torch.Tensor]] = {}
    for e in range(module.num_experts):
        for weight, parts in (("w13", (w13[e, :i], w13[e, i:])), ("w2", (w2[e],))):
            rows: dict[str, list[torch.Tensor]] = {}
            for part in parts:
                for suffix, t in fmt.quantize(part).items():
                    t = expand_rows(t, fmt.expand.get(suffix, 1), part.shape[0])
                    if t.dim() == 0:  # one scale for the part: on each of its held rows
                        t = t.expand(fmt.held(suffix, *part.shape)[0])
                    rows.setdefault(suffix, []).append(t)
            for suffix, ts in rows.items():
                held.setdefault(param_name(weight, suffix), []).append(torch.cat(ts))
    for name, ts in held.items():
        module._parameters[name] = nn.Parameter(torch.stack(ts), requires_grad=False)
