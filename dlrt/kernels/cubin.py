"""Kernels of `csrc/` (shipped as `dlrt/csrc`): compiled on first use with NVRTC, else nvcc
(`dlrt.kernels.compiler`), into the dlrt cache (keyed by the source's hash, the target, the
defines and the compiler with its version), loaded and launched through the driver API, so the
launches are captured into CUDA graphs like any other kernel."""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

import torch

from dlrt import env
from dlrt.errors import DlrtError
from dlrt.kernels.compiler import find_compiler
from dlrt.resources import csrc_path


def check(result):
    """The value of a cuda-bindings call's (error, value...) result; RuntimeError on an error."""
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


def build_cubin(name: str, arch: str, what: str, hint: str | None = None,
                defines: dict[str, str] | None = None) -> Path:
    """Compile csrc/<name> for `arch` (e.g. 'sm_90') once, with the preprocessor `defines`
    (-DNAME=VALUE), by NVRTC or else nvcc; cached by source hash, arch, defines and compiler.

    Returns:
        the path of the CUBIN in `env.cache_dir()/kernels`.
    Raises:
        DlrtError: no compiler ("<what> cannot build csrc/<name>: <what is missing and how to
            get it>; <hint>"), or the source does not compile (the compiler's log).
    """
    src_path = csrc_path(name)
    src = src_path.read_bytes()
    defines = dict(defines or {})
    try:
        compiler = find_compiler()
    except DlrtError as e:
        raise DlrtError(f"{what} cannot build csrc/{name}: {e}" + (f"; {hint}" if hint else "")
                        ) from e
    flags = " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))
    key = b"\0".join([src, arch.encode(), flags.encode(), compiler.key.encode()])
    tag = hashlib.sha256(key).hexdigest()[:16]
    out = env.cache_dir() / "kernels" / f"{src_path.stem}-{arch}-{tag}.cubin"
    if not out.is_file():
        cubin = compiler.compile(src_path, arch, defines)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, out)
    return out


class Kernel:
    """One `extern "C"` kernel of csrc/<source> (built with `defines`), loaded for the current
    device."""

    def __init__(self, source: str, name: str, what: str, hint: str | None = None,
                 defines: dict[str, str] | None = None):
        from cuda.bindings import driver

        major, minor = torch.cuda.get_device_capability()
        data = build_cubin(source, f"sm_{major}{minor}", what, hint, defines).read_bytes()
        torch.cuda.init()
        self._driver = driver
        self._module = check(driver.cuModuleLoadData(data))
        self.func = check(driver.cuModuleGetFunction(self._module, name.encode()))
        self._shared = 0  # the dynamic shared memory this module has allowed the kernel

    def set_shared_bytes(self, nbytes: int) -> None:
        """Allow at least `nbytes` of dynamic shared memory per block (above 48 KiB needs the
        opt-in); the limit only grows, so every launch sized before stays valid."""
        if nbytes <= self._shared:
            return
        attr = self._driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(self._driver.cuFuncSetAttribute(self.func, attr, nbytes))
        self._shared = nbytes

    def max_blocks_per_sm(self, threads: int, shared_bytes: int) -> int:
        """Blocks of `threads` threads and `shared_bytes` of dynamic shared memory that fit
        one SM at once."""
        return int(check(self._driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.func, threads, shared_bytes)))

    def launch(self, grid: int, block: int, args: tuple, types: tuple,
               shared_bytes: int = 0) -> None:
        """Enqueue on torch's current stream (captured when a capture is running)."""
        stream = self._driver.CUstream(torch.cuda.current_stream().cuda_stream)
        check(self._driver.cuLaunchKernel(self.func, grid, 1, 1, block, 1, 1, shared_bytes,
                                          stream, (args, types), 0))


VOID_P = ctypes.c_void_p
