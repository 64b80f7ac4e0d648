"""Every `csrc/` source built by NVRTC on the CPU (no GPU, no CUDA toolkit: cuda-bindings, the
nvidia-cuda-nvrtc and nvidia-cuda-runtime wheels of the test extra), through `build_cubin` as
the host builds it for a GPU of compute capability 9.0 and 8.0: a CUBIN for that architecture
whose defined global functions are exactly the source's `extern "C"` kernels (the persistent
round built one kernel at a time with DLRT_ROUND_ONLY, as `dlrt.runtime.persistent.kernel`
asks for it, bf16 and fp32). The device loop's kernel needs no header folder; a second build
comes from the cache; a source that does not compile is named, with NVRTC's log.
"""

from __future__ import annotations

import platform
import sys

import pytest
from kernel_checks import cubin_kernels

from dlrt.errors import DlrtError
from dlrt.kernels import compiler
from dlrt.kernels.compiler import NVRTC, Missing
from dlrt.kernels.cubin import build_cubin
from dlrt.resources import csrc_path
from dlrt.runtime.persistent.kernel import kernel_id

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="the test extra installs NVRTC (cuda-bindings, nvidia-cuda-nvrtc) on Linux "
           "x86_64 and aarch64 only")

ROUND_BF16, ROUND_F32 = "dlrt_persistent_round_bf16_b4", "dlrt_persistent_round_f32_b4"
CASES = [
    ("graph_cond.cu", {}, {"dlrt_set_condition"}),
    ("all_reduce.cu", {}, {"dlrt_all_reduce_bf16", "dlrt_all_reduce_fp16",
                           "dlrt_all_reduce_fp32"}),
    pytest.param("persistent_round.cu", {"DLRT_ROUND_ONLY": str(kernel_id(ROUND_BF16))},
                 {ROUND_BF16}, marks=pytest.mark.slow, id="persistent_round-bf16"),
    pytest.param("persistent_round.cu", {"DLRT_ROUND_ONLY": str(kernel_id(ROUND_F32))},
                 {ROUND_F32}, marks=pytest.mark.slow, id="persistent_round-f32"),
]


@pytest.fixture(scope="module")
def nvrtc() -> NVRTC:
    try:
        return NVRTC()
    except Missing as e:
        pytest.fail(f"{e}: the test extra brings NVRTC (pip install -e '.[test]')")


@pytest.fixture
def only_nvrtc(nvrtc, monkeypatch, tmp_path) -> NVRTC:
    """`build_cubin` with NVRTC (also where nvcc is installed) into an empty cache."""
    monkeypatch.setattr(compiler, "_search", lambda driver: (nvrtc, ""))
    monkeypatch.setenv("DLRT_CACHE_DIR", str(tmp_path))
    return nvrtc


def test_every_source_has_a_case():
    sources = {c.values[0] if hasattr(c, "values") else c[0] for c in CASES}
    assert sources == {p.name for p in csrc_path("graph_cond.cu").parent.glob("*.cu")}


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("source,defines,kernels", CASES)
def test_builds_with_nvrtc(only_nvrtc, source, defines, kernels, arch):
    path = build_cubin(source, arch, "the test", defines=defines)
    sm, found = cubin_kernels(path.read_bytes())
    assert sm == int(arch[3:]) and found == kernels


def test_the_device_loop_needs_no_headers(only_nvrtc, monkeypatch):
    """csrc/graph_cond.cu builds with NVRTC alone (no cuda_runtime.h anywhere)."""
    monkeypatch.setattr(only_nvrtc, "include_dirs", [])
    path = build_cubin("graph_cond.cu", "sm_90", "the test")
    assert cubin_kernels(path.read_bytes()) == (90, {"dlrt_set_condition"})


def test_a_second_build_comes_from_the_cache(only_nvrtc, monkeypatch):
    first = build_cubin("graph_cond.cu", "sm_90", "the test")

    def no_compile(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(only_nvrtc, "compile", no_compile)
    assert build_cubin("graph_cond.cu", "sm_90", "the test") == first


def test_a_compile_error_names_the_source_and_carries_the_log(nvrtc, tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void k(int* x) { x[0] = undefined_name; }\n')
    with pytest.raises(DlrtError, match=r"(?s)csrc/broken\.cu for sm_90 with nvrtc .*"
                                        r"undefined_name"):
        nvrtc.compile(bad, "sm_90", {})
