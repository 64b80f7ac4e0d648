"""What execution_mode "auto" and an explicit device_loop become where the device loop's
kernel cannot be built or run (`dlrt.runtime.executor.resolve_mode`,
`dlrt.runtime.graphs.device_loop_missing`), on a faked CUDA device: auto falls back to
host_loop with exactly one warning naming what is missing, an explicit device_loop is an
OptionError naming it; where it can run, auto is device_loop; on the CPU, eager without a
probe. The probe itself names a missing cuda-bindings, a missing compiler, and a driver too
old for conditional nodes or for every compiler's CUBINs; an nvcc that suits the driver serves
where NVRTC is too new for it."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from dlrt.engine.config import EngineConfig
from dlrt.errors import OptionError
from dlrt.kernels import compiler
from dlrt.runtime import executor, graphs
from dlrt.runtime.executor import resolve_mode

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU
MISSING = 'no CUDA compiler: no NVRTC, and no nvcc; pip install "cuda-bindings>=13,<14"'


@pytest.fixture
def probe(monkeypatch):
    """probe(answer): what `graphs.device_loop_missing` says; warnings of earlier tests are
    forgotten."""
    answer = [None]
    executor._warn_host_loop.cache_clear()
    monkeypatch.setattr(graphs, "device_loop_missing", lambda: answer[0])

    def set_answer(value):
        answer[0] = value

    yield set_answer
    executor._warn_host_loop.cache_clear()


def test_auto_falls_back_to_host_loop_with_one_warning(probe, caplog):
    probe(MISSING)
    with caplog.at_level(logging.WARNING, logger="dlrt.runtime.executor"):
        assert resolve_mode("auto", CUDA) == "host_loop"
        assert resolve_mode("auto", CUDA) == "host_loop"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and MISSING in warnings[0].getMessage()
    assert "host_loop" in warnings[0].getMessage()


def test_explicit_device_loop_names_what_is_missing(probe):
    probe(MISSING)
    with pytest.raises(OptionError, match=r"'device_loop' cannot run here: no CUDA compiler"):
        resolve_mode("device_loop", CUDA)
    assert resolve_mode("host_loop", CUDA) == "host_loop"


def test_auto_is_device_loop_where_it_can_run(probe, caplog):
    probe(None)
    with caplog.at_level(logging.WARNING):
        assert resolve_mode("auto", CUDA) == "device_loop"
        assert resolve_mode("device_loop", CUDA) == "device_loop"
    assert not caplog.records


def test_auto_on_the_cpu_is_eager_without_a_probe(monkeypatch):
    def fail():
        raise AssertionError("probed on the CPU")

    monkeypatch.setattr(graphs, "device_loop_missing", fail)
    assert resolve_mode("auto", torch.device("cpu")) == "eager"


def test_engine_config_on_a_faked_cuda(probe, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    probe(MISSING)
    with caplog.at_level(logging.WARNING, logger="dlrt.runtime.executor"):
        assert EngineConfig.from_kwargs(device="cuda").resolve_device().execution_mode == \
            "host_loop"
    assert len(caplog.records) == 1
    with pytest.raises(OptionError, match="cannot run here: no CUDA compiler"):
        EngineConfig.from_kwargs(device="cuda", execution_mode="device_loop").resolve_device()
    probe(None)
    assert EngineConfig.from_kwargs(device="cuda").resolve_device().execution_mode == \
        "device_loop"


def test_the_probe_names_a_missing_compiler(monkeypatch):
    pytest.importorskip("cuda.bindings.runtime")
    monkeypatch.setattr(compiler, "_search", lambda driver: (None, MISSING))
    assert graphs.device_loop_missing() == MISSING


def test_the_probe_names_missing_cuda_bindings(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # its import fails
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert graphs.device_loop_missing() == (
        'cuda-bindings is not installed; pip install "cuda-bindings>=12.4,<13" '
        "nvidia-cuda-nvrtc-cu12")


@pytest.fixture
def compilers(monkeypatch):
    """compilers(nvrtc, nvcc): the versions of the compilers found here (None: that one is
    missing). Lookups start afresh."""
    def fake(name, version):
        def make():
            if version is None:
                raise compiler.Missing(f"no {name} was found")
            found = compiler.Compiler(version)
            found.name = name
            return found
        return make

    def install(nvrtc, nvcc):
        monkeypatch.setattr(compiler, "NVRTC", fake("nvrtc", nvrtc))
        monkeypatch.setattr(compiler, "NVCC", fake("nvcc", nvcc))

    compiler._search.cache_clear()
    yield install
    compiler._search.cache_clear()


@pytest.mark.parametrize("driver,nvrtc,nvcc,wants", [
    (12080, (13, 0), None, "no CUDA compiler: nvrtc 13.0 builds for CUDA 13 drivers, and the "
                           "NVIDIA driver supports CUDA 12.8, and no nvcc was found; pip"),
    (12080, (13, 0), (12, 8), None),
    (12020, (12, 9), None, "the NVIDIA driver supports CUDA 12.2, older than 12.4"),
    (13000, (13, 0), None, None),
    (12080, (12, 9), None, None),
    (12080, None, (12, 6), None),
])
def test_the_probe_checks_the_driver(monkeypatch, compilers, driver, nvrtc, nvcc, wants):
    bindings = pytest.importorskip("cuda.bindings.driver")
    compilers(nvrtc, nvcc)
    monkeypatch.setattr(bindings, "cuDriverGetVersion", lambda: (0, driver))
    found = graphs.device_loop_missing()
    assert found == wants or (wants is not None and found.startswith(wants))
