"""The embedded default model: `dlrt/data/sdar-stdlib-8m`, a 7.6M-parameter SDAR model trained
on the Python standard library by `tools/train_default.py` (its README.md is the model card).
It ships inside the package as a Hugging Face folder; nothing is written at run time."""

from __future__ import annotations

import os
from pathlib import Path

from dlrt.errors import CheckpointError
from dlrt.resources import data_path

DEFAULT_MODEL = "sdar-stdlib-8m"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_model_path() -> Path:
    """The packaged folder of the embedded default model.

    Raises:
        CheckpointError: the folder or one of its files is missing or unreadable (the message
            names the path: the installation is incomplete).
    """
    path = data_path(DEFAULT_MODEL)
    if not path.is_dir():
        raise CheckpointError(f"the embedded default model {path} is missing: the dlrt "
                              "installation is incomplete (reinstall dlrt, or pass a model)")
    bad = [n for n in _REQUIRED if not (path / n).is_file() or not os.access(path / n, os.R_OK)]
    if bad:
        raise CheckpointError(f"the embedded default model {path} lacks readable "
                              f"{', '.join(bad)}: the dlrt installation is incomplete "
                              "(reinstall dlrt, or pass a model)")
    return path
