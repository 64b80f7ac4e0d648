"""Progress bars for long operations: loading a checkpoint's tensors, writing a checkpoint
(`make-checkpoint`), the settings of `bench quality`, the steps of training the default model.
tqdm on stderr, shown only when stderr is a terminal and the process is not quiet (`set_quiet`,
the CLI's `--quiet`). Every bar of the package is made here; `write` prints a line to stderr
without breaking a bar that is drawn."""

from __future__ import annotations

import sys
from typing import Any

_quiet = False


def set_quiet(quiet: bool = True) -> None:
    """Turn the bars off (or back on) for the whole process."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    """Whether bars are drawn: not quiet, and stderr is a terminal."""
    isatty = getattr(sys.stderr, "isatty", None)
    return not _quiet and bool(isatty and isatty())


def bar(total: int, desc: str, unit: str = "tensor", show: bool = True) -> Any:
    """A tqdm bar of `total` steps on stderr (disabled unless `enabled()` and `show`); use it
    as a context manager and call `update(n)`."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                disable=not (show and enabled()), dynamic_ncols=True)


def write(line: str) -> None:
    """`line` on stderr (always, quiet or not), above any bar being drawn."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()
