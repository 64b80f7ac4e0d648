"""The embedded default model: the tiny SDAR preset with the real SDAR tokenizer, written into
the dlrt cache folder on first use (seeded: every machine makes the same one)."""

from __future__ import annotations

import logging
from pathlib import Path

from dlrt import env
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.make import make_checkpoint
from dlrt.errors import CheckpointError

log = logging.getLogger(__name__)

DEFAULT_PRESET = "tiny-sdar"
DEFAULT_SEED = 0
_DEFAULT_VERSION = "v1"


def default_model_path() -> Path:
    """The embedded default model; written (deterministically, seed 0) on first use, and
    written again when the cached copy is broken (e.g. its weights are missing).

    Raises:
        CheckpointError: it cannot be written (DLRT_CACHE_DIR is a file or unwritable) or a
            broken copy cannot be replaced.
    """
    path = env.cache_dir() / "models" / f"{DEFAULT_PRESET}-{_DEFAULT_VERSION}"
    if not _loadable(path):
        try:
            log.warning("making the embedded default model (%s, random weights, once) in %s; "
                        "DLRT_CACHE_DIR moves it", DEFAULT_PRESET, path)
            make_checkpoint(DEFAULT_PRESET, path, seed=DEFAULT_SEED, overwrite=path.exists())
        except CheckpointError as e:
            if not _loadable(path):  # else another process made it first
                raise CheckpointError(
                    f"cannot make the embedded default model in {path}: {e}. Set "
                    f"DLRT_CACHE_DIR to a writable folder, or delete {path}") from e
    return path


def _loadable(path: Path) -> bool:
    if not (path / "config.json").is_file():
        return False
    try:
        CheckpointFolder.open(path)
    except CheckpointError:
        return False
    return True
