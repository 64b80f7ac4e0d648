"""Files shipped with the package: `dlrt/data` (found through the package's own resources) and
the CUDA sources of `csrc/` (in the wheel as `dlrt/csrc`; in a checkout at the top level)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def data_path(*parts: str) -> Path:
    """A file or folder under `dlrt/data` (tokenizers, real configs, benchmark prompts)."""
    return Path(str(resources.files("dlrt").joinpath("data", *parts)))


def csrc_path(name: str) -> Path:
    """A CUDA source of the repository's `csrc/`: `dlrt/csrc` in an installed wheel (setup.py
    maps the folder into the package), the top-level `csrc/` beside the package in a
    checkout (an editable install or the source tree on the path)."""
    package = Path(__file__).resolve().parent
    shipped = package / "csrc" / name
    return shipped if shipped.is_file() else package.parent / "csrc" / name
