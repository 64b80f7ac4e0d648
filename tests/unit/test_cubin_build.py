"""Building `csrc/` kernels without a compiler run (`dlrt.kernels.cubin.build_cubin`,
`dlrt.kernels.compiler`): the cache serves a second build; the defines, the architecture and the
compiler with its version each give another cache entry; NVRTC is preferred to nvcc; with
neither, the error names the kernel, the source, what is missing and the pip command for this
torch's CUDA version."""

from __future__ import annotations

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
        monkeypatch.setattr(compiler, "_search", lambda: (c, ""))
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


def test_nvrtc_comes_before_nvcc(monkeypatch):
    made = []

    class First(FakeCompiler):
        def __init__(self):
            made.append("nvrtc")
            super().__init__()

    class Second(FakeCompiler):
        def __init__(self):
            made.append("nvcc")
            super().__init__()

    monkeypatch.setattr(compiler, "NVRTC", First)
    monkeypatch.setattr(compiler, "NVCC", Second)
    assert isinstance(compiler._search.__wrapped__()[0], First) and made == ["nvrtc"]


def test_without_a_compiler_the_error_names_what_is_missing(monkeypatch, tmp_path):
    def no_nvrtc():
        raise Missing("cuda-bindings found no NVRTC library (libnvrtc.so.13)")

    def no_nvcc():
        raise Missing("no nvcc was found")

    monkeypatch.setattr(compiler, "NVRTC", no_nvrtc)
    monkeypatch.setattr(compiler, "NVCC", no_nvcc)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    found = compiler._search.__wrapped__()
    monkeypatch.setattr(compiler, "_search", lambda: found)
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
