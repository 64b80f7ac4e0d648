"""Quantised weight formats by name. Each format module of this package (`fp8`, `nvfp4`,
`compressed_tensors`) registers its `QuantFormat` when it is imported (`register`); `formats`
imports every module of the package first, so adding a format is adding one module here (plus
its kernels), and the `quantization` option's choices, the checkpoint reader, make-checkpoint
and the load-time kernel plan all find it.
"""

from __future__ import annotations

import importlib
import pkgutil

from dlrt.errors import OptionError
from dlrt.layers.quant import QuantFormat

_FORMATS: dict[str, QuantFormat] = {}
_DISCOVERED = False


def register(fmt: QuantFormat) -> QuantFormat:
    """Add `fmt` under its name; returns it (a module's `FORMAT = register(MyFormat())`).

    Raises:
        ValueError: another format object holds the name, even one of the same class
            ("auto" and "none" are option values); registering `fmt` again is no change.
    """
    if fmt.name in ("auto", "none", "base"):
        raise ValueError(f"a quantised format cannot be named {fmt.name!r}")
    held = _FORMATS.get(fmt.name)
    if held is not None and held is not fmt:
        raise ValueError(f"quantised format {fmt.name!r} is registered twice "
                         f"({_named(held)}, {_named(fmt)})")
    _FORMATS[fmt.name] = fmt
    return fmt


def _named(fmt: QuantFormat) -> str:
    return f"{type(fmt).__module__}.{type(fmt).__qualname__} at {id(fmt):#x}"


def formats() -> dict[str, QuantFormat]:
    """Every registered format by name, in name order (this package's modules imported on the
    first call, so each registers itself)."""
    global _DISCOVERED
    if not _DISCOVERED:
        import dlrt.layers.quant as package

        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _DISCOVERED = True
    return dict(sorted(_FORMATS.items()))


def format_names() -> tuple[str, ...]:
    """The registered formats' names, in order: the `quantization` option's choices after
    "auto" and "none"."""
    return tuple(formats())


def get_format(name: str) -> QuantFormat:
    """The format registered as `name`.

    Raises:
        OptionError: no such format (the message lists the formats).
    """
    fmt = formats().get(name)
    if fmt is None:
        raise OptionError(f"quantization {name!r}: unknown quantised format; one of "
                          f"{list(format_names())}")
    return fmt
