"""The training corpus: the `.py` files of the running interpreter's standard library.

The tree is found at run time (`sysconfig`), so each machine trains on its own Python's
library; the record names the tree, its Python version, the files and characters. The split
is by file: a file is held out when the sha1 of its path relative to the tree root, read as a
number in [0, 1), is below `held_out_share`, so the same tree splits the same way everywhere.

Kept: every `.py` file under the root that reads as UTF-8, the `test` / `tests` folders too
unless `include_tests=False` (they double the corpus and are still standard-library Python).
Skipped: `site-packages` (installed third-party code, different on every machine), `__pycache__`,
`_sysconfigdata_*.py` (generated per build) and files that are not valid UTF-8 (a few encoding
tests; counted in `skipped`).
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HELD_OUT_SHARE = 0.05
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_TEST_DIRS = {"test", "tests"}


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def held_out_fraction(rel: str) -> float:
    """A stable number in [0, 1) for a POSIX path relative to the corpus root."""
    digest = hashlib.sha1(rel.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def is_held_out(rel: str, share: float = HELD_OUT_SHARE) -> bool:
    return held_out_fraction(rel) < share


def source_paths(root: Path, include_tests: bool = True) -> list[str]:
    """Sorted POSIX paths (relative to `root`) of the `.py` files the corpus reads."""
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        folders = set(rel.parts[:-1])
        if folders & _SKIP_DIRS or rel.name.startswith("_sysconfigdata_"):
            continue
        if not include_tests and folders & _TEST_DIRS:
            continue
        if path.is_file():
            out.append(rel.as_posix())
    return sorted(out)


@dataclass
class Corpus:
    """Texts of the training and held-out files, each list sorted by path."""

    root: Path
    train: list[tuple[str, str]] = field(default_factory=list)  # (relative path, text)
    held_out: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # not UTF-8
    include_tests: bool = True

    def record(self) -> dict[str, Any]:
        """What a training record says about the corpus (tokens are added by the trainer)."""
        return {
            "tree": str(self.root),
            "python": platform.python_version(),
            "include_tests": self.include_tests,
            "files": {"train": len(self.train), "held_out": len(self.held_out),
                      "skipped_not_utf8": len(self.skipped)},
            "chars": {"train": sum(len(t) for _, t in self.train),
                      "held_out": sum(len(t) for _, t in self.held_out)},
        }


def load_corpus(root: str | Path | None = None, include_tests: bool = True,
                held_out_share: float = HELD_OUT_SHARE) -> Corpus:
    """Read the corpus under `root` (default: `stdlib_root()`) and split it by file.

    Raises:
        FileNotFoundError: `root` is not a folder or holds no `.py` file.
    """
    base = Path(root).resolve() if root is not None else stdlib_root()
    if not base.is_dir():
        raise FileNotFoundError(f"corpus root {base} is not a folder")
    corpus = Corpus(base, include_tests=include_tests)
    for rel in source_paths(base, include_tests):
        try:
            text = (base / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            corpus.skipped.append(rel)
            continue
        split = corpus.held_out if is_held_out(rel, held_out_share) else corpus.train
        split.append((rel, text))
    if not corpus.train:
        raise FileNotFoundError(f"no readable .py file under {base}")
    return corpus
