"""A Hugging Face checkpoint folder: config, generation config, safetensors files and index."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrt.checkpoint.hub import download, is_repo_id
from dlrt.decoding.options import SAMPLING, sampling_default_problem
from dlrt.errors import CheckpointError, OptionError

INDEX_NAME = "model.safetensors.index.json"
GENERATION_CONFIG = "generation_config.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return data


@dataclass
class CheckpointFolder:
    """The files of one checkpoint. `tensor_files` maps each tensor name to its safetensors file
    (empty when the folder has no weights, e.g. a config-only folder for dummy loading)."""

    path: Path
    hf_config: dict[str, Any]
    generation_config: dict[str, Any]
    tensor_files: dict[str, Path] = field(default_factory=dict)

    @staticmethod
    def open(path: str | Path, require_weights: bool = True) -> CheckpointFolder:
        """Read a checkpoint folder, or a Hugging Face repo id ("org/name", not an existing
        path) fetched or found in the hub cache (`dlrt.checkpoint.hub`).

        Raises:
            OptionError: `path` is not a path (a str or os.PathLike) or is empty.
            CheckpointError: not a folder, a repo id the hub cannot give (`hub.download`), no
                `config.json`, weights only in a pickle format
                (.bin/.pt: never loaded), an index naming a missing file or one outside the
                folder, or no weights at all when `require_weights`.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise OptionError(f"model must be a checkpoint folder path, got {path!r} "
                              f"({type(path).__name__})")
        if not str(path).strip():
            raise OptionError("model is an empty path; give a checkpoint folder")
        root = Path(path).expanduser()
        if not root.exists() and is_repo_id(str(path)):
            root = download(str(path), weights=require_weights)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint folder {root} does not exist or is not a folder "
                                  "(a Hugging Face repo id, org/name, is fetched from the hub)")
        if not (root / "config.json").is_file():
            raise CheckpointError(f"{root} has no config.json")
        hf_config = _read_json(root / "config.json")
        gen_path = root / GENERATION_CONFIG
        generation = _read_json(gen_path) if gen_path.is_file() else {}
        files = _tensor_files(root) if require_weights else {}
        return CheckpointFolder(root, hf_config, generation, files)

    def check_generation_config(self, vocab_size: int) -> None:
        """Check the `generation_config.json` fields dlrt reads (null or absent: unset):
        eos_token_id (a token id or a non-empty list of them), pad_token_id (a token id),
        do_sample (true or false), and the sampling defaults temperature, top_k and top_p
        (`dlrt.decoding.options.SAMPLING`): numbers always, and in the option's range when
        do_sample is true (otherwise dlrt does not use them). A token id is an integer in
        [0, vocab_size).

        Raises:
            CheckpointError: the file's path, the field and its value.
        """
        gen, path = self.generation_config, self.path / GENERATION_CONFIG

        def check(key: str, ok: bool, want: str) -> None:
            if not ok:
                raise CheckpointError(f"{path}: {key}={gen[key]!r} must be {want}")

        def token(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size

        ids = f"a token id in [0, {vocab_size})"
        eos = gen.get("eos_token_id")
        if eos is not None:
            check("eos_token_id", token(eos) or (isinstance(eos, list) and bool(eos)
                                                 and all(token(v) for v in eos)),
                  f"{ids} or a non-empty list of them")
        if gen.get("pad_token_id") is not None:
            check("pad_token_id", token(gen["pad_token_id"]), ids)
        sample = gen.get("do_sample")
        if sample is not None:
            check("do_sample", isinstance(sample, bool), "true or false")
        for key in SAMPLING:
            if gen.get(key) is not None:
                problem = sampling_default_problem(key, gen[key], in_range=bool(sample))
                if problem is not None:
                    raise CheckpointError(f"{path}: {key}={gen[key]!r} {problem}")

    def has_tokenizer(self) -> bool:
        return any((self.path / n).is_file()
                   for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))


def _tensor_files(root: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index = root / INDEX_NAME
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no weight_map")
        for fname in weight_map.values():
            if not isinstance(fname, str) or Path(fname).is_absolute() \
                    or ".." in Path(fname).parts:
                raise CheckpointError(f"{index} names {fname!r}, which is not a file inside {root}")
        files = {name: root / fname for name, fname in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise CheckpointError(f"{index} names {f.name}, which is not in {root}")
        return files
    shards = sorted(root.glob("*.safetensors"))
    if not shards:
        pickles = sorted(p.name for p in root.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(
                f"{root} holds only non-safetensors weights ({', '.join(pickles[:3])}); dlrt "
                "loads safetensors only (pickle files can run code): convert the checkpoint")
        raise CheckpointError(f"{root} has no *.safetensors weights (and no {INDEX_NAME})")
    files: dict[str, Path] = {}
    for shard in shards:
        try:
            with safe_open(shard, framework="pt") as f:
                for name in f.keys():
                    files[name] = shard
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{shard} is not a valid safetensors file: {e}") from e
    return files
