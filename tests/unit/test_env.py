"""The kernel-selection environment variables: values, defaults, and bad values refused."""

from __future__ import annotations

import pytest

from dlrt import env
from dlrt.errors import OptionError


def test_skinny_gemm_values(monkeypatch):
    monkeypatch.delenv("DLRT_SKINNY_GEMM", raising=False)
    assert env.skinny_gemm() == "1"
    for value in ("0", "1", "all"):
        monkeypatch.setenv("DLRT_SKINNY_GEMM", value)
        assert env.skinny_gemm() == value
    monkeypatch.setenv("DLRT_SKINNY_GEMM", "yes")
    with pytest.raises(OptionError, match="DLRT_SKINNY_GEMM must be 0, 1 or all"):
        env.skinny_gemm()


def test_pdl_and_fused_kernels_switches(monkeypatch):
    monkeypatch.delenv("DLRT_PDL", raising=False)
    monkeypatch.delenv("DLRT_FUSED_KERNELS", raising=False)
    assert env.pdl() and env.fused_kernels()
    monkeypatch.setenv("DLRT_PDL", "0")
    monkeypatch.setenv("DLRT_FUSED_KERNELS", "0")
    assert not env.pdl() and not env.fused_kernels()
