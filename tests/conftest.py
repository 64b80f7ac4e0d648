"""Shared fixtures: tiny checkpoints written once per session with our own tool, an isolated
dlrt cache folder (a temp folder, removed when the session ends), and the `gpu` marker
(skipped without CUDA). Temp folders of passing tests are not kept (`tmp_path_retention_policy`
in pyproject.toml)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

_MADE_CACHE = pytest.StashKey[str]()


def pytest_configure(config):
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # NOTE: pytest-xdist's workers ignore SIGINT, and an ignored signal stays ignored in
        # the processes they start: the tests that interrupt a command need it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not torch.cuda.is_available():
        # NOTE: before any Triton kernel is defined: kernels run in Triton's CPU interpreter.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # NOTE: set before any test imports dlrt, so built kernels and kernel timings go to a temp
    # folder (removed when the session ends).
    if "DLRT_CACHE_DIR" not in os.environ:
        import tempfile

        config.stash[_MADE_CACHE] = tempfile.mkdtemp(prefix="dlrt-test-cache-")
        os.environ["DLRT_CACHE_DIR"] = config.stash[_MADE_CACHE]


def pytest_unconfigure(config):
    made = config.stash.get(_MADE_CACHE, None)
    if made is not None:
        import shutil

        shutil.rmtree(made, ignore_errors=True)
        if os.environ.get("DLRT_CACHE_DIR") == made:
            del os.environ["DLRT_CACHE_DIR"]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _make(tmp_path_factory, preset: str, **kw):
    from dlrt.checkpoint.make import make_checkpoint

    return make_checkpoint(preset, tmp_path_factory.mktemp(preset) / "ckpt", **kw)


@pytest.fixture(scope="session")
def tiny_sdar(tmp_path_factory):
    """A tiny SDAR checkpoint (fp32 weights, seed 0) with the SDAR tokenizer."""
    return _make(tmp_path_factory, "tiny-sdar", dtype="float32")


@pytest.fixture(scope="session")
def tiny_sdar_moe(tmp_path_factory):
    """A tiny SDAR-MoE checkpoint (8 experts, top-2), fp32, seed 0."""
    return _make(tmp_path_factory, "tiny-sdar-moe", dtype="float32")


@pytest.fixture(scope="session")
def tiny_llada(tmp_path_factory):
    """A tiny LLaDA checkpoint (no tokenizer: use token ids), fp32, seed 0."""
    return _make(tmp_path_factory, "tiny-llada", dtype="float32")


@pytest.fixture(scope="session")
def tiny_llada2(tmp_path_factory):
    """A tiny LLaDA2 MoE checkpoint (8 experts, top-2, groups; no tokenizer), fp32, seed 0."""
    return _make(tmp_path_factory, "tiny-llada2", dtype="float32")


@pytest.fixture(scope="session")
def tiny_diffusion_gemma(tmp_path_factory):
    """A tiny DiffusionGemma checkpoint (canvas 16, 8192 ids) with the embedded default
    model's tokenizer, fp32, seed 0."""
    return _make(tmp_path_factory, "tiny-diffusion-gemma", dtype="float32")


@pytest.fixture(scope="session")
def tiny_diffusion_gemma_graphs(tmp_path_factory):
    """tiny-diffusion-gemma as the graph modes can run it: full attention in every layer and
    one head shape (what the capturable `triton` backend serves; windows and per-layer shapes
    need `sdpa`, eager only) and 8 experts top-2 (its GELU experts take the PyTorch MoE, whose
    fixed-shape gather path, no host sync, serves up to 4 (token, expert) pairs per expert: a
    canvas of 16). fp32, seed 0, no tokenizer."""
    import json

    from dlrt.checkpoint.make import make_checkpoint
    from dlrt.checkpoint.presets import preset

    hf = preset("tiny-diffusion-gemma")[0]
    t = hf["text_config"]
    t.update(layer_types=["full_attention"] * t["num_hidden_layers"],
             global_head_dim=t["head_dim"],
             num_global_key_value_heads=t["num_key_value_heads"], num_experts=8)
    src = tmp_path_factory.mktemp("dg-graphs") / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(hf))
    return make_checkpoint(src, src.parent / "ckpt", dtype="float32")
