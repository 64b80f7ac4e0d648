"""Building `csrc/` kernels without a compiler run (`dlrt.kernels.cubin.build_cubin`,
`dlrt.kernels.compiler`): the cache serves a second build; the defines, the architecture and the
compiler with its version each give another cache entry; NVRTC is preferred to nvcc, but where
a driver is loaded a compiler of a newer CUDA major version than the driver's is skipped with a
warning naming it (one lookup per driver version); with neither, the error names the kernel, the
source, what is missing and the pip command for this torch's CUDA version."""

from __future__ import annotations

import logging

import pytest
import torch

from dlrt.errors import DlrtError
from dlrt.kernels import compiler
from dlrt.kernels.compiler import Compiler, Missing
from dlrt.kernels.cubin import build_cubin


class FakeCompiler(Compiler):
    name = "fake"

    def __init__(self, version=(13, 0)):
        super().__init__(version)
        self.calls = []

    def compile(self, source, arch, defines):
        self.calls.append((source.name, arch, dict(defines)))
        return b"\x7fELF" + repr(self.calls[-1]).encode()


@pytest.fixture
def use(monkeypatch, tmp_path):
    """use(compiler): build_cubin compiles with it into an empty cache folder."""
    monkeypatch.setenv("DLRT_CACHE_DIR", str(tmp_path))

    def set_compiler(c):
        monkeypatch.setattr(compiler, "_search", lambda driver: (c, ""))
        return c

    return set_compiler


def test_a_second_build_hits_the_cache(use):
    fake = use(FakeCompiler())
    first = build_cubin("graph_cond.cu", "sm_90", "the test")
    assert build_cubin("graph_cond.cu", "sm_90", "the test") == first
    assert fake.calls == [("graph_cond.cu", "sm_90", {})]
    assert first.read_bytes().startswith(b"\x7fELF")


def test_defines_arch_and_compiler_are_in_the_key(use):
    fake = use(FakeCompiler())
    base = build_cubin("persistent_round.cu", "sm_90", "the test",
                       defines={"DLRT_ROUND_ONLY": "1"})
    other = {build_cubin("persistent_round.cu", "sm_90", "the test",
                         defines={"DLRT_ROUND_ONLY": "2"}),
             build_cubin("persistent_round.cu", "sm_80", "the test",
                         defines={"DLRT_ROUND_ONLY": "1"})}
    assert len(fake.calls) == 3 and base not in other and len(other) == 2
    newer = use(FakeCompiler((13, 1)))
    again = build_cubin("persistent_round.cu", "sm_90", "the test",
                        defines={"DLRT_ROUND_ONLY": "1"})
    assert again != base and len(newer.calls) == 1 and again.name.startswith(
        "persistent_round-sm_90-")


@pytest.fixture
def installed(monkeypatch):
    """installed(nvrtc, nvcc): the versions of the compilers found here (None: that one is
    Missing); returns the names in the order they were made. Lookups start afresh."""
    made = []

    def fake(name, version):
        def make():
            made.append(name)
            if version is None:
                raise Missing(f"no {name} here")
            found = FakeCompiler(version)
            found.name = name
            return found
        return make

    def install(nvrtc, nvcc):
        monkeypatch.setattr(compiler, "NVRTC", fake("nvrtc", nvrtc))
        monkeypatch.setattr(compiler, "NVCC", fake("nvcc", nvcc))
        return made

    compiler._search.cache_clear()
    yield install
    compiler._search.cache_clear()


@pytest.mark.parametrize("driver", [None, (13, 0), (13, 1)])
def test_nvrtc_comes_before_nvcc(installed, driver):
    made = installed((13, 0), (13, 0))
    found, why = compiler._search(driver)
    assert found.name == "nvrtc" and why == "" and made == ["nvrtc"]


def test_without_a_driver_nvrtc_is_taken_whatever_its_version(installed, monkeypatch):
    made = installed((13, 0), (12, 8))
    monkeypatch.setattr(compiler, "driver_version", lambda: None)
    assert str(compiler.find_compiler()) == "nvrtc 13.0" and made == ["nvrtc"]


def test_a_compiler_newer_than_the_driver_is_skipped(installed, monkeypatch, caplog):
    made = installed((13, 0), (12, 8))
    monkeypatch.setattr(compiler, "driver_version", lambda: (12, 8))
    with caplog.at_level(logging.WARNING, logger="dlrt.kernels.compiler"):
        assert str(compiler.find_compiler()) == "nvcc 12.8"
        assert str(compiler.find_compiler()) == "nvcc 12.8"
    assert compiler.missing_compiler() is None and made == ["nvrtc", "nvcc"]
    assert [r.getMessage() for r in caplog.records] == [
        "the csrc kernels are built with nvcc 12.8: nvrtc 13.0 builds for CUDA 13 drivers, "
        "and the NVIDIA driver supports CUDA 12.8"]


def test_the_lookup_is_kept_per_driver_version(installed, monkeypatch):
    made = installed((13, 0), (12, 8))
    driver = [(12, 8)]
    monkeypatch.setattr(compiler, "driver_version", lambda: driver[0])
    assert str(compiler.find_compiler()) == "nvcc 12.8"
    driver[0] = (13, 0)
    assert str(compiler.find_compiler()) == "nvrtc 13.0"
    driver[0] = (12, 8)
    assert str(compiler.find_compiler()) == "nvcc 12.8"
    assert made == ["nvrtc", "nvcc", "nvrtc"]


def test_when_every_compiler_is_too_new_the_error_names_each(installed, monkeypatch):
    installed((13, 0), (13, 0))
    monkeypatch.setattr(compiler, "driver_version", lambda: (12, 8))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(DlrtError) as e:
        compiler.find_compiler()
    assert str(e.value) == (
        "no CUDA compiler: nvrtc 13.0 builds for CUDA 13 drivers, and the NVIDIA driver "
        "supports CUDA 12.8, and nvcc 13.0 builds for CUDA 13 drivers, and the NVIDIA driver "
        'supports CUDA 12.8; pip install "cuda-bindings>=12.4,<13" nvidia-cuda-nvrtc-cu12')


def test_without_a_compiler_the_error_names_what_is_missing(monkeypatch, tmp_path):
    def no_nvrtc():
        raise Missing("cuda-bindings found no NVRTC library (libnvrtc.so.13)")

    def no_nvcc():
        raise Missing("no nvcc was found")

    monkeypatch.setattr(compiler, "NVRTC", no_nvrtc)
    monkeypatch.setattr(compiler, "NVCC", no_nvcc)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    found = compiler._search.__wrapped__(None)
    monkeypatch.setattr(compiler, "_search", lambda driver: found)
    monkeypatch.setenv("DLRT_CACHE_DIR", str(tmp_path))
    assert compiler.missing_compiler() == found[1]
    with pytest.raises(DlrtError, match=r"the device loop cannot build csrc/graph_cond\.cu: no "
                       r"CUDA compiler: cuda-bindings found no NVRTC library \(libnvrtc\.so\.13"
                       r"\), and no nvcc was found; pip install \"cuda-bindings>=13,<14\" "
                       r"nvidia-cuda-nvrtc; or use host_loop"):
        build_cubin("graph_cond.cu", "sm_90", "the device loop", "or use host_loop")
    assert not (tmp_path / "kernels").exists()


@pytest.mark.parametrize("cuda,wants", [
    ("12.8", 'pip install "cuda-bindings>=12.4,<13" nvidia-cuda-nvrtc-cu12'),
    ("13.0", 'pip install "cuda-bindings>=13,<14" nvidia-cuda-nvrtc'),
    (None, 'pip install "dlrt[gpu]"'),
])
def test_the_install_hint_follows_torchs_cuda(monkeypatch, cuda, wants):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert compiler.install_hint() == wants
