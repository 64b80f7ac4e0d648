"""The compilers of `csrc/`: NVRTC first, nvcc where NVRTC is missing or, with a driver loaded,
newer than the driver (a CUDA 13 CUBIN does not load on a CUDA 12 driver); each builds a CUBIN
for one real architecture (`sm_XY`) from the same source and defines.

NVRTC comes from cuda-bindings (`cuda.bindings.nvrtc`), which loads libnvrtc through
cuda-pathfinder: the `nvidia-cuda-nvrtc` / `nvidia-cuda-nvrtc-cu12` wheels that torch's CUDA
builds install, conda, CUDA_HOME or the system. It needs no GPU and no CUDA toolkit. The
fp16/bf16/fp8 headers come from cuda-pathfinder's `cudart` header folder (the
`nvidia-cuda-runtime` wheel, conda, CUDA_HOME); `csrc/graph_cond.cu` needs none.

- nvcc: `nvcc -cubin -arch=sm_XY -O3 -DNAME=VALUE ...`
- NVRTC: `--gpu-architecture=sm_XY --std=c++17 -DNAME=VALUE -I<source folder> -I<headers>`.
  Device code is optimised by default (nvcc's -O3 is the host compiler's level); the sources
  see `__CUDACC_RTC__` and declare themselves what NVRTC does not include (libc types).
  NOTE: nvcc addresses shared memory through 32-bit pointers, NVRTC through 64-bit ones (no
  option changes it). With CUDA 13.0 both give graph_cond.cu's SASS and all_reduce.cu's but
  for a constant-bank slot; the persistent round's kernels differ by a few registers (ptxas:
  no spills, the same stack and shared memory either way).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from dlrt.errors import DlrtError

log = logging.getLogger(__name__)

MIN_CUDA = (12, 4)  # conditional graph nodes (cudaGraphSetConditional)


class Missing(Exception):
    """A compiler cannot be used here; the message says why."""


class Compiler:
    """Builds one `csrc/` source into a CUBIN. `key` (name and version) is part of the cache
    key of what it builds."""

    name = ""

    def __init__(self, version: tuple[int, int]):
        self.version = version

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version[0]}.{self.version[1]}"

    def __str__(self) -> str:
        return f"{self.name} {self.version[0]}.{self.version[1]}"

    def compile(self, source: Path, arch: str, defines: dict[str, str]) -> bytes:
        """The CUBIN of `source` for `arch` (e.g. 'sm_90') with -DNAME=VALUE `defines`.

        Raises:
            DlrtError: the source does not compile (names it, with the compiler's log).
        """
        raise NotImplementedError


class NVRTC(Compiler):
    """libnvrtc through cuda-bindings; Missing where either is absent or older than 12.4."""

    name = "nvrtc"

    def __init__(self):
        try:
            from cuda.bindings import nvrtc
        except ImportError as e:
            raise Missing("cuda-bindings is not installed") from e
        try:
            err, major, minor = nvrtc.nvrtcVersion()
        except RuntimeError as e:  # cuda-pathfinder found no libnvrtc
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise Missing(f"cuda-bindings found no NVRTC library ({why})") from e
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise Missing(f"NVRTC does not answer its version ({err!r})")
        if (major, minor) < MIN_CUDA:
            raise Missing(f"NVRTC {major}.{minor} is older than CUDA "
                          f"{MIN_CUDA[0]}.{MIN_CUDA[1]}")
        super().__init__((major, minor))
        self._nvrtc = nvrtc

    @functools.cached_property
    def include_dirs(self) -> list[str]:
        return header_dirs()

    def compile(self, source: Path, arch: str, defines: dict[str, str]) -> bytes:
        nvrtc = self._nvrtc
        opts = [f"--gpu-architecture={arch}", "--std=c++17",
                *(f"-D{k}={v}" for k, v in sorted(defines.items())),
                *(f"-I{d}" for d in [source.parent, *self.include_dirs])]
        name = f"csrc/{source.name}"
        prog = self._ok(nvrtc.nvrtcCreateProgram(source.read_bytes(), name.encode(), 0, [], []),
                        name)
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
            if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise DlrtError(f"building {name} for {arch} with {self} failed:\n"
                                f"{self._log(prog)}")
            size = self._ok(nvrtc.nvrtcGetCUBINSize(prog), name)
            cubin = b" " * size
            self._ok(nvrtc.nvrtcGetCUBIN(prog, cubin), name)
            return cubin
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    def _log(self, prog) -> str:
        size = self._ok(self._nvrtc.nvrtcGetProgramLogSize(prog), "the log")
        log = b" " * size
        self._ok(self._nvrtc.nvrtcGetProgramLog(prog, log), "the log")
        return log.rstrip(b"\0").decode(errors="replace").strip()

    def _ok(self, result: tuple, what: str):
        err, *value = result
        if err != self._nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise DlrtError(f"NVRTC failed on {what}: {err!r}")
        return value[0] if value else None


class NVCC(Compiler):
    """The nvcc of CUDA_HOME, /usr/local/cuda or PATH; Missing where none is, or it is older
    than 12.4."""

    name = "nvcc"

    def __init__(self):
        self.path = _nvcc_path()
        if self.path is None:
            raise Missing("no nvcc was found (CUDA_HOME, /usr/local/cuda, PATH)")
        try:
            out = subprocess.run([self.path, "--version"], capture_output=True,
                                 text=True).stdout
        except OSError as e:
            raise Missing(f"{self.path} does not run ({e})") from e
        found = re.search(r"release (\d+)\.(\d+)", out)
        if found is None:
            raise Missing(f"{self.path} --version names no release")
        version = (int(found[1]), int(found[2]))
        if version < MIN_CUDA:
            raise Missing(f"nvcc {version[0]}.{version[1]} ({self.path}) is older than CUDA "
                          f"{MIN_CUDA[0]}.{MIN_CUDA[1]}")
        super().__init__(version)

    def compile(self, source: Path, arch: str, defines: dict[str, str]) -> bytes:
        with tempfile.TemporaryDirectory(prefix="dlrt-nvcc-") as tmp:
            out = Path(tmp) / f"{source.stem}.cubin"
            cmd = [self.path, "-cubin", f"-arch={arch}", "-O3",
                   *(f"-D{k}={v}" for k, v in sorted(defines.items())), "-o", str(out),
                   str(source)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise DlrtError(f"building csrc/{source.name} for {arch} with {self} failed:\n"
                                f"{proc.stderr.strip()}")
            return out.read_bytes()


def _nvcc_path() -> str | None:
    for home in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def header_dirs() -> list[str]:
    """The folder of the CUDA runtime headers (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h) that
    cuda-pathfinder finds, else CUDA_HOME's; [] when there is none."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
    except (ImportError, RuntimeError):
        found = None
    if found is None and os.environ.get("CUDA_HOME"):
        home = Path(os.environ["CUDA_HOME"]) / "include"
        found = str(home) if (home / "cuda_fp16.h").is_file() else None
    return [found] if found else []


def driver_version() -> tuple[int, int] | None:
    """The CUDA version (major, minor) of the loaded NVIDIA driver; None where cuda-bindings or
    the driver is missing (CPU-only machines)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        err, version = driver.cuDriverGetVersion()
    except RuntimeError:  # no libcuda here
        return None
    if int(err) != 0:
        return None
    return version // 1000, version % 1000 // 10


@functools.cache
def _search(driver: tuple[int, int] | None) -> tuple[Compiler | None, str]:
    reasons, skipped = [], []
    for kind in (NVRTC, NVCC):
        try:
            found = kind()
        except Missing as e:
            reasons.append(str(e))
            continue
        if driver is not None and found.version[0] > driver[0]:
            # NOTE: a CUBIN of a newer CUDA major version does not load on this driver.
            skipped.append(f"{found} builds for CUDA {found.version[0]} drivers, and the NVIDIA "
                           f"driver supports CUDA {driver[0]}.{driver[1]}")
            reasons.append(skipped[-1])
            continue
        if skipped:
            log.warning("the csrc kernels are built with %s: %s", found, "; ".join(skipped))
        return found, ""
    return None, f"no CUDA compiler: {reasons[0]}, and {reasons[1]}; {install_hint()}"


def find_compiler() -> Compiler:
    """NVRTC where cuda-bindings loads it, else nvcc (each of CUDA >= 12.4); where a driver is
    loaded, one whose CUDA major version is newer than the driver's is skipped (its CUBINs
    would not load), with a warning naming it. Looked up once per driver version.

    Raises:
        DlrtError: none is here (the message names what is missing or skipped, and why, and
            how to get one).
    """
    compiler, why = _search(driver_version())
    if compiler is None:
        raise DlrtError(why)
    return compiler


def missing_compiler() -> str | None:
    """None when `find_compiler` finds one; else what is missing and how to get it."""
    return _search(driver_version())[1] or None


def install_hint() -> str:
    """The pip command that brings NVRTC for this torch's CUDA version."""
    major = (torch.version.cuda or "").split(".")[0]
    if major == "12":
        return 'pip install "cuda-bindings>=12.4,<13" nvidia-cuda-nvrtc-cu12'
    if major == "13":
        return 'pip install "cuda-bindings>=13,<14" nvidia-cuda-nvrtc'
    return 'pip install "dlrt[gpu]"'
