"""Hugging Face repo ids as models, against a fake local hub cache (never the network): a
cached repo loads offline like a folder, with only the files dlrt reads; a repo the cache does
not hold says how to download it; paths are never taken for repo ids."""

from __future__ import annotations

import shutil

import pytest

from dlrt import LLM
from dlrt.checkpoint.folder import CheckpointFolder
from dlrt.checkpoint.hub import is_repo_id
from dlrt.errors import CheckpointError


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny_sdar):
    """A hub cache holding acme/tiny-sdar (the tiny checkpoint plus a .py that must never run
    and a .bin that must never be read), with the hub offline."""
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-sdar" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_sdar, snap)
    (snap / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    (snap / "pytorch_model.bin").write_bytes(b"not loaded")
    (cache / "models--acme--tiny-sdar" / "refs").mkdir()
    (cache / "models--acme--tiny-sdar" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_repo_ids():
    assert is_repo_id("JetLM/SDAR-1.7B-Chat") and is_repo_id("acme/tiny_sdar.v2")
    for path in ("/tmp/model", "./acme/tiny", "acme/tiny/sub", "model", "~/m", "../x", "a/.."):
        assert not is_repo_id(path), path


def test_a_cached_repo_loads_offline(hub, tiny_sdar):
    folder = CheckpointFolder.open("acme/tiny-sdar")
    assert folder.path == hub / "models--acme--tiny-sdar" / "snapshots" / "0123abcd"
    assert folder.tensor_files and folder.has_tokenizer()
    llm = LLM("acme/tiny-sdar", device="cpu")
    ref = LLM(tiny_sdar, device="cpu")
    prompt = [11, 22, 33, 44, 55]
    assert llm.generate(prompt, max_new_tokens=8).token_ids == \
        ref.generate(prompt, max_new_tokens=8).token_ids


def test_a_repo_not_in_the_cache_says_how_to_download(hub):
    with pytest.raises(CheckpointError, match=r"cannot be reached.*hf download acme/other"):
        CheckpointFolder.open("acme/other")


def test_a_missing_path_is_not_a_repo(tmp_path, hub):
    with pytest.raises(CheckpointError, match="does not exist or is not a folder"):
        CheckpointFolder.open(tmp_path / "acme" / "tiny-sdar")
    with pytest.raises(CheckpointError, match="does not exist or is not a folder"):
        CheckpointFolder.open("nothing-here")


def test_only_what_dlrt_reads_is_fetched(monkeypatch, tiny_sdar):
    import huggingface_hub

    asked = []

    def fake(repo_id, allow_patterns):
        asked.append((repo_id, list(allow_patterns)))
        return str(tiny_sdar)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert CheckpointFolder.open("acme/tiny-sdar").path == tiny_sdar
    CheckpointFolder.open("acme/tiny-sdar", require_weights=False)  # dummy weights: no files
    (repo, with_weights), (_, without) = asked
    assert repo == "acme/tiny-sdar" and "*.safetensors" in with_weights
    assert "*.safetensors" not in without and "*.json" in without
    assert not [p for p in with_weights if p.endswith((".py", ".bin", ".pt", "*"))]

    def unreachable(repo_id, allow_patterns):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(CheckpointError, match="cannot be reached .ConnectionError.*hf download"):
        CheckpointFolder.open("acme/tiny-sdar")
