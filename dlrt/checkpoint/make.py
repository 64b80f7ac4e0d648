"""Write a Hugging Face checkpoint folder with seeded random weights.

From a built-in preset or any folder holding a `config.json` (such as the real SDAR/LLaDA/
LLaDA2/DiffusionGemma configs), write `config.json`, `generation_config.json`, safetensors
shards with `model.safetensors.index.json` (when more than one shard), and for SDAR the SDAR
tokenizer (tiny-diffusion-gemma: the embedded default model's).
Weights: normal(0, initializer_range), norms at 1, router biases (`expert_bias`) in fp32 and
drawn like weights; each tensor seeded by (seed, name), so the output is the same for a seed
whatever the sharding. Loading it goes through the same loader as a user's checkpoint;
`load_format="dummy"` reproduces the same values without files.

`quantization="fp8"` / `"nvfp4"` / `"compressed-tensors-fp8"` (any registered format,
`dlrt.layers.quant.registry`) writes the quantised layers (`dlrt.checkpoint.quant`: every linear
layer but the LM head and those the model keeps unquantised, DiffusionGemma's routers, which
the not-convert list names; and the routed experts, one tensor per expert and part even where
the unquantised checkpoint stacks them) in that format, quantised from the values drawn
in `dtype`, with the format's config entries (`quantization_config`; NVFP4 also
`hf_quant_config.json`); loading the
unquantised checkpoint of the same seed with `quantization=...` gives the same bits.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from dlrt import progress
from dlrt.checkpoint.folder import INDEX_NAME, CheckpointFolder
from dlrt.checkpoint.loader import spec_value, stored_dtype, weight_specs
from dlrt.checkpoint.presets import (
    PRESETS,
    preset,
    preset_tokenizer,
    real_config,
    real_configs,
)
from dlrt.checkpoint.quant import quantize_for_writing
from dlrt.errors import CheckpointError, OptionError
from dlrt.layers.quant.registry import format_names, formats
from dlrt.models.family import Family
from dlrt.models.registry import build_model, family_of, model_config
from dlrt.ops import reference
from dlrt.resources import data_path

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
_CHECKPOINT_FILES = ("config.json", "generation_config.json", INDEX_NAME, *_TOKENIZER_FILES)


def write_choices() -> tuple[str, ...]:
    """`make_checkpoint`'s quantization choices: "none" and every registered format (the
    `quantization` option's, `dlrt.checkpoint.quant.quantizations`, add "auto")."""
    return ("none", *format_names())


def _checkpoint_files() -> set[str]:
    """The files a written checkpoint may hold beside its safetensors (the formats' own too)."""
    return {*_CHECKPOINT_FILES, *(f for fmt in formats().values() for f in fmt.files)}


def _source(source: str | Path) -> tuple[dict, dict, Path | None]:
    """(config, generation_config, the folder whose tokenizer files are copied, if any). A
    folder without generation_config.json gets the eos ids of its config (`text_config`'s for
    a config that nests them, as DiffusionGemma's does)."""
    if str(source) in PRESETS:
        cfg, gen = preset(str(source))
        return cfg, gen, preset_tokenizer(str(source))
    if not Path(source).exists():
        if not real_config(str(source)):
            raise CheckpointError(f"{source}: no such folder, preset or shipped config; presets: "
                                  f"{', '.join(PRESETS)}; shipped configs: "
                                  f"{', '.join(real_configs())}")
        source = real_config(str(source))
    folder = CheckpointFolder.open(source, require_weights=False)
    gen = dict(folder.generation_config)
    text = folder.hf_config.get("text_config")
    eos = folder.hf_config.get("eos_token_id")
    if eos is None and isinstance(text, dict):
        eos = text.get("eos_token_id")
    if not gen and eos is not None:
        gen = {"eos_token_id": eos}
    return dict(folder.hf_config), gen, folder.path


def make_checkpoint(source: str | Path, out: str | Path, seed: int = 0,
                    dtype: str = "bfloat16", num_layers: int | None = None,
                    max_shard_bytes: int = 5 * 10**9, device: str = "cpu",
                    overwrite: bool = False, quantization: str = "none") -> Path:
    """Write the checkpoint and return its folder.

    Args:
        source: a preset name (`dlrt.checkpoint.presets.PRESETS`), the name of a shipped real
            config (`dlrt/data/configs`: SDAR-1.7B-Chat, SDAR-4B-Chat, SDAR-8B-Chat,
            SDAR-30B-A3B-Chat, LLaDA-8B-Instruct, LLaDA-MoE-7B-A1B-Instruct, LLaDA2.0-mini,
            DiffusionGemma-26B-A4B-it),
            or a folder with config.json.
        out: destination folder (must not exist unless `overwrite`; even then only an empty
            folder or a checkpoint folder is replaced).
        num_layers: keep only this many layers (a reduced copy of a large config).
        max_shard_bytes: shard size limit, as `save_pretrained(max_shard_size=...)`.
        device: where the random values are drawn ('cpu' is reproducible everywhere).
        quantization: "none" or a registered format: "fp8" (128x128 block-scaled e4m3),
            "nvfp4", "compressed-tensors-fp8" (e4m3 with a scale per output row; see the
            module docstring). A source's own `quantization_config` is
            dropped: the output holds what this asks for.
    Raises:
        OptionError: an unknown quantization (the message lists the choices).
        CheckpointError: bad source, a weight shape the format cannot hold (NVFP4: in
            features not a multiple of 16), existing destination (also one that appears while
            writing, unless `overwrite`; with `overwrite`, one that is not a checkpoint
            folder), an unwritable destination, unknown dtype or device, max_shard_bytes < 1,
            or num_layers out of range.
        ConfigError: the config names an unsupported model.
    """
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if quantization not in write_choices():
        raise OptionError(f"quantization {quantization!r}: unknown quantization; one of "
                          f"{list(write_choices())}")
    _check_device(device)
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) \
            or max_shard_bytes < 1:
        raise CheckpointError(f"max_shard_bytes={max_shard_bytes!r} must be an integer >= 1")
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a checkpoint folder (a file): choose "
                              "another output path")
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    if out.exists():
        _check_replaceable(out)
    hf, gen, src_dir = _source(source)
    config = model_config(hf)
    family = family_of(hf)
    if num_layers is not None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) \
                or not 1 <= num_layers <= config.num_layers:
            raise CheckpointError(f"num_layers={num_layers!r} must be in [1, "
                                  f"{config.num_layers}] (keep only this many layers)")
        hf = family.with_layers(hf, num_layers)
        config = model_config(hf)
    hf.pop("quantization_config", None)  # the source's format is not what is written
    with torch.device("meta"):
        model = build_model(config, reference.OPS)
    quant = None
    if quantization != "none":
        quant = quantize_for_writing(model, config.hidden_size, quantization)
    specs = weight_specs(model, online=True)
    torch_dtype = DTYPES[dtype]
    shards: list[list] = [[]]
    size = 0
    for s in specs:
        itemsize = torch.empty((), dtype=s.dtype or stored_dtype(s.key, torch_dtype)
                               ).element_size()
        nbytes = itemsize * int(torch.Size(s.shape).numel())
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += nbytes
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    except OSError as e:
        raise CheckpointError(f"cannot write the checkpoint {out}: {e}") from e
    try:
        weight_map, total, sources = {}, 0, {}
        shown = progress.bar(sum(len(shard) for shard in shards), f"writing {out.name}")
        for i, shard in enumerate(shards):
            name = ("model.safetensors" if len(shards) == 1
                    else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
            tensors = {}
            for s in shard:
                tensors[s.key] = spec_value(s, seed, config.initializer_range,
                                            stored_dtype(s.key, torch_dtype), device,
                                            sources).cpu()
                shown.update(1)
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            weight_map.update({s.key: name for s in shard})
            del tensors
        shown.close()
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2))
        hf["torch_dtype"] = dtype
        if quant is not None:
            hf["quantization_config"] = quant[0]
            for name, data in quant[1].items():
                (tmp / name).write_text(json.dumps(data, indent=2))
        (tmp / "config.json").write_text(json.dumps(hf, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        _copy_tokenizer(src_dir, family, tmp)
        _default_modes(tmp)
        if out.exists() and overwrite:
            _check_replaceable(out)  # NOTE: again: it may have changed while writing
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError as e:  # NOTE: `out` appeared while writing (another process made it)
            raise CheckpointError(f"{out} was created by someone else meanwhile: {e}") from e
    except OSError as e:
        raise CheckpointError(f"cannot write the checkpoint {out}: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _check_device(device: str) -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise CheckpointError(f"device {device!r} is not a valid device") from e
    if dev.type not in ("cpu", "cuda"):
        raise CheckpointError(f"device {device!r}: random values are drawn on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"device {device!r} asked for, but CUDA is not available")


def _check_replaceable(out: Path) -> None:
    """Refuse to delete `out` unless it is an empty folder or looks like a checkpoint folder:
    config.json and nothing but checkpoint and tokenizer files."""
    names = {p.name for p in out.iterdir()} if out.is_dir() else None
    ours = names is not None and (not names or "config.json" in names and all(
        n in _checkpoint_files() or n.endswith(".safetensors") for n in names))
    if not ours:
        raise CheckpointError(f"{out} is not a checkpoint folder (config.json, safetensors and "
                              "tokenizer files only): not replacing it; remove it yourself")


def _copy_tokenizer(src_dir: Path | None, family: Family, dst: Path) -> None:
    """The source's tokenizer files, else the family's shipped tokenizer (if it has one)."""
    has_tokenizer = src_dir is not None and any((src_dir / n).is_file() for n in _TOKENIZER_FILES)
    src = src_dir if has_tokenizer else None
    if src is None and family.tokenizer is not None:
        src = data_path(family.tokenizer)
    if src is None:
        return
    for n in _TOKENIZER_FILES:
        if (src / n).is_file():
            shutil.copyfile(src / n, dst / n)


def _default_modes(folder: Path) -> None:
    """Give the folder and its files the modes the umask allows (mkdtemp makes them private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)
