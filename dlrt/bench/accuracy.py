"""Accuracy of the low-precision weight formats: logits of one forward over N prompt positions.

For each precision (`PRECISIONS`: fp8 with dynamic activations, fp8 weight-only, nvfp4) the
logits of one prefill forward (a fixed seeded id sequence, block-causal in the model's blocks,
as the block decoder's prefill) are compared
  (a) with the same model in the model dtype on the *dequantised* weights (for the weight-only
      precisions the exact reference: what is left is kernel / matmul-order error, ~0 on the
      CPU's dequantising path; for fp8 with dynamic activations it also holds the activations'
      quantisation error),
  (b) with the unquantised model (the quantisation error),
as relative L2 errors ||x - ref|| / ||ref||, plus the fraction of positions whose argmax token
agrees with the unquantised model. One model is held at a time (the dequantised weights of the
quantised model are kept while it is freed and the unquantised one is built). The checkpoint
must be unquantised (a quantised one is refused, naming what to give instead).

    dlrt bench accuracy --model DIR --load-format dummy --num-tokens 64 --dtype float32
"""

from __future__ import annotations

import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dlrt.bench.report import table, write_json
from dlrt.errors import OptionError

# precision name -> the engine options that load it
PRECISIONS = {"fp8": dict(quantization="fp8", fp8_activations="dynamic"),
              "fp8-weight_only": dict(quantization="fp8", fp8_activations="weight_only"),
              "nvfp4": dict(quantization="nvfp4")}
COLUMNS = ["quantization", "rel_err_vs_dequantised", "rel_err_vs_unquantised",
           "argmax_agreement", "load_s", "forward_s"]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def prompt_ids(vocab_size: int, n: int, seed: int = 0) -> torch.Tensor:
    """The fixed seeded id sequence the forward reads."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n,), generator=g)


def _free(*objs: Any) -> None:
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def logits(llm, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Float32 CPU logits of one block-causal forward over `ids` and its seconds."""
    b = llm.engine.resolved.block_length  # a default request's block
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = llm.runner.forward_at(ids.to(llm.device), 0, chunk_block=b)
        if llm.device.type == "cuda":
            torch.cuda.synchronize(llm.device)
    return out.float().cpu(), time.perf_counter() - t0


def dequantised_weights(llm) -> dict[tuple[str, str], torch.Tensor]:
    """(module name, weight) -> the quantised module's weight dequantised into the model
    dtype, on the model's device."""
    out = {}
    for name, m in llm.engine.model.named_modules():
        fmt = getattr(m, "quant_format", None)
        if fmt is None:
            continue
        for weight, k in m.quant_cols.items():
            held = {s: getattr(m, p) for p, (w, s) in m.quant_params.items() if w == weight}
            out[(name, weight)] = fmt.dequantize(held, k, llm.dtype)
    return out


def load_into(llm, weights: dict[tuple[str, str], torch.Tensor]) -> None:
    modules = dict(llm.engine.model.named_modules())
    for (name, weight), w in weights.items():
        getattr(modules[name], weight).data.copy_(w)


def reduced_model(model: str | Path, num_layers: int, into: Path) -> Path:
    """A config-only folder of `model` with its first `num_layers` layers (dummy weights)."""
    from dlrt.checkpoint.folder import CheckpointFolder
    from dlrt.models.registry import family_of

    folder = CheckpointFolder.open(model, require_weights=False)
    hf = family_of(folder.hf_config).with_layers(dict(folder.hf_config), num_layers)
    into.mkdir(parents=True, exist_ok=True)
    (into / "config.json").write_text(json.dumps(hf))
    gen = folder.path / "generation_config.json"
    if gen.is_file():
        (into / "generation_config.json").write_text(gen.read_text())
    return into


def run(llm_kwargs: dict[str, Any], quantizations: list[str], num_tokens: int,
        seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows (one per precision) and facts of the model; one model alive at a time."""
    from dlrt import LLM

    kw = {**llm_kwargs, "max_model_len": -(-num_tokens // 256) * 256, "execution_mode": "eager"}
    t0 = time.perf_counter()
    plain = LLM(**{**kw, "quantization": "none"})
    load = time.perf_counter() - t0
    ids = prompt_ids(plain.engine.model_config.vocab_size, num_tokens, seed)
    base, fwd = logits(plain, ids)
    facts = dict(dtype=str(plain.dtype).removeprefix("torch."), torch_device=str(plain.device),
                 num_layers=plain.engine.model_config.num_layers,
                 vocab_size=plain.engine.model_config.vocab_size,
                 block=plain.engine.resolved.block_length)
    rows = [dict(quantization="none", rel_err_vs_dequantised=0.0, rel_err_vs_unquantised=0.0,
                 argmax_agreement=1.0, load_s=load, forward_s=fwd)]
    _free(plain)
    plain = None
    top = base.argmax(-1)
    for q in quantizations:
        t0 = time.perf_counter()
        quant = LLM(**{**kw, **PRECISIONS[q]})
        load = time.perf_counter() - t0
        ours, fwd = logits(quant, ids)
        weights = dequantised_weights(quant)
        modules = len({n for n, _ in weights})
        _free(quant)
        quant = None
        ref_llm = LLM(**{**kw, "quantization": "none"})
        load_into(ref_llm, weights)
        _free(weights)
        weights = None
        ref, _ = logits(ref_llm, ids)
        _free(ref_llm)
        ref_llm = None
        rows.append(dict(quantization=q, rel_err_vs_dequantised=rel_err(ours, ref),
                         rel_err_vs_unquantised=rel_err(ours, base),
                         argmax_agreement=(ours.argmax(-1) == top).float().mean().item(),
                         load_s=load, forward_s=fwd, quantised_modules=modules))
    return rows, facts


def _refuse_quantised(model: str | Path) -> None:
    """OptionError naming `model` when its folder holds quantised weights: the command quantises
    an unquantised checkpoint while loading and compares it with that checkpoint, and dlrt
    does not dequantise a quantised one at load."""
    from dlrt.checkpoint.folder import CheckpointFolder
    from dlrt.checkpoint.quant import read_scheme

    folder = CheckpointFolder.open(model, require_weights=False)
    scheme = read_scheme(folder.hf_config, folder.path)
    if scheme is not None:
        raise OptionError(f"--model: {folder.path} holds {scheme.name} weights; bench "
                          "accuracy compares each precision with the unquantised model, which "
                          "dlrt cannot rebuild from quantised weights: give --model the "
                          "unquantised checkpoint (--quantization lists the precisions it is "
                          "quantised to while loading)")


def main(args, llm_kwargs: dict[str, Any]) -> int:
    quantizations = [q.strip() for q in args.quantization.split(",") if q.strip()]
    bad = [q for q in quantizations if q not in PRECISIONS]
    if bad or not quantizations:
        raise OptionError(f"--quantization: expected some of {', '.join(PRECISIONS)}, got "
                          f"{args.quantization!r}")
    model = llm_kwargs.get("model")
    if model is not None:
        _refuse_quantised(model)
    with tempfile.TemporaryDirectory() as tmp:
        kw = dict(llm_kwargs)
        if args.num_layers is not None:
            if kw.get("load_format") != "dummy":
                raise OptionError("--num-layers needs --load-format dummy")
            if model is None:
                raise OptionError("--num-layers needs --model")
            kw["model"] = reduced_model(model, args.num_layers, Path(tmp) / "model")
        rows, facts = run(kw, quantizations, args.num_tokens)
    shown = [{**r, **{c: f"{r[c]:.2e}" for c in COLUMNS[1:3]}} for r in rows]
    print(table(shown, COLUMNS))
    name = f"accuracy-{str(model or 'default').rstrip('/').split('/')[-1]}"
    device = torch.device(facts["torch_device"])
    path = write_json(name, dict(model=str(model), load_format=llm_kwargs.get("load_format"),
                                 num_tokens=args.num_tokens, **facts, rows=rows),
                      device, args.out)
    print(f"wrote {path}")
    return 0
