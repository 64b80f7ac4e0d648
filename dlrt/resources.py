"""Files shipped inside the package (`dlrt/data`, `dlrt/csrc`), found through the package's own
resources, so an installed wheel and a checkout find them the same way."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def data_path(*parts: str) -> Path:
    """A file or folder under `dlrt/data` (tokenizers, real configs, benchmark prompts)."""
    return Path(str(resources.files("dlrt").joinpath("data", *parts)))


def csrc_path(name: str) -> Path:
    """A CUDA source under `dlrt/csrc` (the repository's `csrc/`, shipped with the package)."""
    return Path(str(resources.files("dlrt").joinpath("csrc", name)))
