"""Write a Hugging Face checkpoint folder with seeded random weights.

From a built-in preset or any folder holding a `config.json` (such as the real SDAR/LLaDA
configs), write `config.json`, `generation_config.json`, safetensors shards with
`model.safetensors.index.json` (when more than one shard), and for SDAR the SDAR tokenizer.
Weights: normal(0, initializer_range), norms at 1; each tensor seeded by (seed, name), so the
output is the same for a seed whatever the sharding. Loading it goes through the same loader as
a user's checkpoint; `load_format="dummy"` reproduces the same values without files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from dlrt.checkpoint.folder import INDEX_NAME, CheckpointFolder
from dlrt.checkpoint.loader import random_tensor, weight_specs
from dlrt.checkpoint.presets import PRESETS, TOKENIZER_DIR, preset
from dlrt.config import ModelConfig
from dlrt.errors import CheckpointError
from dlrt.models import build_model

_LAYER_KEYS = ("num_hidden_layers", "n_layers")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _source(source: str | Path) -> tuple[dict, dict, Path | None]:
    if str(source) in PRESETS:
        cfg, gen = preset(str(source))
        return cfg, gen, None
    folder = CheckpointFolder.open(source, require_weights=False)
    gen = dict(folder.generation_config)
    if not gen and folder.hf_config.get("eos_token_id") is not None:
        gen = {"eos_token_id": folder.hf_config["eos_token_id"]}
    return dict(folder.hf_config), gen, folder.path


def make_checkpoint(source: str | Path, out: str | Path, seed: int = 0,
                    dtype: str = "bfloat16", num_layers: int | None = None,
                    max_shard_bytes: int = 5 * 10**9, device: str = "cpu",
                    overwrite: bool = False) -> Path:
    """Write the checkpoint and return its folder.

    Args:
        source: a preset name (`dlrt.checkpoint.presets.PRESETS`) or a folder with config.json.
        out: destination folder (must not exist unless `overwrite`).
        num_layers: keep only this many layers (a reduced copy of a large config).
        max_shard_bytes: shard size limit, as `save_pretrained(max_shard_size=...)`.
        device: where the random values are drawn ('cpu' is reproducible everywhere).
    Raises:
        CheckpointError: bad source, existing destination (also one that appears while
            writing, unless `overwrite`), or unknown dtype.
        ConfigError: the config names an unsupported model.
    """
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    hf, gen, src_dir = _source(source)
    if num_layers is not None:
        key = next((k for k in _LAYER_KEYS if k in hf), None)
        if key is None or num_layers < 1:
            raise CheckpointError(f"cannot set num_layers={num_layers} on this config")
        hf[key] = num_layers
        if hf.get("max_window_layers"):
            hf["max_window_layers"] = num_layers
    config = ModelConfig.from_hf(hf)
    with torch.device("meta"):
        specs = weight_specs(build_model(config))
    torch_dtype = DTYPES[dtype]
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    shards: list[list] = [[]]
    size = 0
    for s in specs:
        nbytes = itemsize * int(torch.Size(s.shape).numel())
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += nbytes
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            name = ("model.safetensors" if len(shards) == 1
                    else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
            tensors = {s.key: random_tensor(s, seed, config.initializer_range, torch_dtype,
                                            device).cpu() for s in shard}
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            weight_map.update({s.key: name for s in shard})
            del tensors
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2))
        hf["torch_dtype"] = dtype
        (tmp / "config.json").write_text(json.dumps(hf, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        _copy_tokenizer(src_dir, config.family, tmp)
        if out.exists() and overwrite:
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError as e:  # NOTE: `out` appeared while writing (another process made it)
            raise CheckpointError(f"{out} was created by someone else meanwhile: {e}") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _copy_tokenizer(src_dir: Path | None, family: str, dst: Path) -> None:
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
             "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
    src = src_dir if src_dir is not None and any((src_dir / n).is_file() for n in names) else None
    if src is None and family in ("sdar", "sdar_moe"):
        src = TOKENIZER_DIR
    if src is None:
        return
    for n in names:
        if (src / n).is_file():
            shutil.copyfile(src / n, dst / n)
