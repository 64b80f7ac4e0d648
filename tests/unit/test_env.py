"""The environment variables: only whole-process settings (engine options are `EngineConfig`
fields); the attention backend's variable is the default of `attention_backend="auto"`."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrt import env
from dlrt.engine.config import EngineConfig
from dlrt.errors import OptionError


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DLRT_CACHE_DIR", str(tmp_path / "c"))
    assert env.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DLRT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir() == tmp_path / "xdg" / "dlrt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert env.cache_dir() == Path.home() / ".cache" / "dlrt"


def test_attention_backend_variable_is_the_auto_default(monkeypatch):
    monkeypatch.setenv("DLRT_ATTENTION_BACKEND", "sdpa")
    cfg = EngineConfig.from_kwargs(device="cpu").resolve_device()
    assert cfg.attention_backend == "sdpa"
    monkeypatch.setenv("DLRT_ATTENTION_BACKEND", "warp")
    with pytest.raises(OptionError, match="DLRT_ATTENTION_BACKEND=warp"):
        EngineConfig.from_kwargs(device="cpu").resolve_device()
    # an explicit option wins over the variable
    cfg = EngineConfig.from_kwargs(device="cpu", attention_backend="sdpa").resolve_device()
    assert cfg.attention_backend == "sdpa"


def test_persistent_prefetch_bytes(monkeypatch):
    monkeypatch.delenv("DLRT_PERSISTENT_PREFETCH", raising=False)
    assert env.persistent_prefetch_bytes() == 0  # off: it measured slower
    monkeypatch.setenv("DLRT_PERSISTENT_PREFETCH", "65536")
    assert env.persistent_prefetch_bytes() == 65536
    monkeypatch.setenv("DLRT_PERSISTENT_PREFETCH", "-5")
    with pytest.raises(ValueError, match="DLRT_PERSISTENT_PREFETCH='-5'"):
        env.persistent_prefetch_bytes()


def test_persistent_pages(monkeypatch):
    monkeypatch.delenv("DLRT_PERSISTENT_PAGES", raising=False)
    assert env.persistent_pages() == 0
    monkeypatch.setenv("DLRT_PERSISTENT_PAGES", "4")
    assert env.persistent_pages() == 4
    for bad in ("-1", "four", "2.5"):
        monkeypatch.setenv("DLRT_PERSISTENT_PAGES", bad)
        with pytest.raises(ValueError, match="DLRT_PERSISTENT_PAGES"):
            env.persistent_pages()


def test_persistent_wait_limit(monkeypatch):
    monkeypatch.delenv("DLRT_PERSISTENT_WAIT_LIMIT", raising=False)
    assert env.persistent_wait_limit_s() == 2.0
    monkeypatch.setenv("DLRT_PERSISTENT_WAIT_LIMIT", "0")
    assert env.persistent_wait_limit_s() == 0.0
    for bad in ("-1", "soon", "nan", "inf"):
        monkeypatch.setenv("DLRT_PERSISTENT_WAIT_LIMIT", bad)
        with pytest.raises(ValueError, match="DLRT_PERSISTENT_WAIT_LIMIT"):
            env.persistent_wait_limit_s()
