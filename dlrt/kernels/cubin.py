"""Kernels of `csrc/` (shipped as `dlrt/csrc`): compiled with nvcc on first use into the dlrt
cache (keyed by the source's hash and the target), loaded and launched through the driver API,
so the launches are captured into CUDA graphs like any other kernel."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

from dlrt import env
from dlrt.errors import DlrtError
from dlrt.resources import csrc_path


def check(result):
    """The value of a cuda-bindings call's (error, value...) result; RuntimeError on an error."""
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


def nvcc(why: str) -> str:
    """The nvcc binary (CUDA_HOME, /usr/local/cuda, PATH); else DlrtError(`why`)."""
    for home in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found is None:
        raise DlrtError(why)
    return found


def build_cubin(name: str, arch: str, what: str, hint: str = "set CUDA_HOME",
                defines: dict[str, str] | None = None) -> Path:
    """Compile csrc/<name> for `arch` (e.g. 'sm_90') once, with the preprocessor `defines`
    (-DNAME=VALUE); cached by source hash, arch and defines. Without nvcc: DlrtError "<what>
    needs nvcc (CUDA >= 12.4) to build csrc/<name>; <hint>"."""
    src_path = csrc_path(name)
    src = src_path.read_bytes()
    flags = [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    tag = hashlib.sha256(src + arch.encode() + " ".join(flags).encode()).hexdigest()[:16]
    out = env.cache_dir() / "kernels" / f"{src_path.stem}-{arch}-{tag}.cubin"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        why = f"{what} needs nvcc (CUDA >= 12.4) to build csrc/{name}; {hint}"
        cmd = [nvcc(why), "-cubin", f"-arch={arch}", "-O3", *flags, "-o", str(tmp),
               str(src_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise DlrtError(f"building {src_path.name} failed: {proc.stderr.strip()}")
        os.replace(tmp, out)
    return out


class Kernel:
    """One `extern "C"` kernel of csrc/<source> (built with `defines`), loaded for the current
    device."""

    def __init__(self, source: str, name: str, what: str, hint: str = "set CUDA_HOME",
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
