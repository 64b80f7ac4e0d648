"""`LLM.sleep` / `LLM.wake_up` on the CPU: after sleep(1) and a wake the tokens equal those
before; sleep(1) frees the KV cache and the programs and moves every parameter to other
(CPU) storage; sleep(2) drops the weights, which `update_weights(folder)` or
`wake_up(folder)` bring back; every call that runs the model raises `AsleepError` while
asleep, and so do the calls that cannot run at that level."""

from __future__ import annotations

import pytest
import torch

from dlrt import LLM
from dlrt.errors import AsleepError, DlrtError, OptionError, WeightsError

PROMPT = [5, 6, 7, 8, 9, 10]
REQUEST = dict(max_new_tokens=8, temperature=0.0, seed=0, ignore_eos=True)


def tokens(llm: LLM) -> list[int]:
    return llm.generate(PROMPT, **REQUEST).token_ids


def storage_bytes(llm: LLM) -> int:
    return sum(p.untyped_storage().nbytes() for p in llm.model.parameters())


@pytest.fixture(scope="module")
def sdar(tiny_sdar):
    llm = LLM(tiny_sdar, dtype="float32")
    return llm, tokens(llm)


@pytest.mark.parametrize("preset", ["tiny_sdar", "tiny_llada2", "tiny_diffusion_gemma"])
def test_sleep_1_and_wake_give_the_same_tokens(preset, request):
    llm = LLM(request.getfixturevalue(preset), dtype="float32")
    before = tokens(llm)
    ptrs = {n: p.data_ptr() for n, p in llm.model.named_parameters()}
    weights = {n: p.detach().clone() for n, p in llm.model.named_parameters()}
    assert llm.kv_cache.nbytes > 0 and llm.decoder.programs
    llm.sleep(1)
    assert llm.is_sleeping
    assert llm.kv_cache.nbytes == 0 and not llm.decoder.programs
    for n, p in llm.model.named_parameters():  # copies in CPU memory, same values
        assert p.device.type == "cpu" and p.data_ptr() != ptrs[n], n
        assert torch.equal(p, weights[n]), n
    assert all(b.device.type == "cpu" for b in llm.model.buffers())
    llm.wake_up()
    assert not llm.is_sleeping and llm.kv_cache.nbytes > 0
    assert tokens(llm) == before


def test_tied_parameters_stay_tied(tmp_path):
    llm = LLM()  # the embedded default model: its LM head is its embedding
    before = tokens(llm)
    for level in (1, 2):
        llm.sleep(level)
        assert llm.model.lm_head.weight is llm.model.model.embed_tokens.weight
        llm.wake_up(llm.folder.path if level == 2 else None)
        assert llm.model.lm_head.weight is llm.model.model.embed_tokens.weight
        assert tokens(llm) == before


@pytest.mark.parametrize("call", [
    lambda llm: llm.generate(PROMPT, **REQUEST),
    lambda llm: next(llm.stream(PROMPT, **REQUEST)),
    lambda llm: llm.set_execution_mode("eager"),
    lambda llm: llm.collective_rpc(len),
    lambda llm: llm.sleep(1),
    lambda llm: llm.sleep(2),
    lambda llm: llm.update_weights({}),
], ids=["generate", "stream", "set_execution_mode", "collective_rpc", "sleep1", "sleep2",
        "update_weights"])
def test_calls_while_asleep_are_named_errors(sdar, call):
    llm, before = sdar
    llm.sleep(1)
    try:
        with pytest.raises(AsleepError, match="level 1.*wake_up"):
            call(llm)
        assert llm.check(PROMPT, **REQUEST)[0] == PROMPT  # the host-only calls answer
        assert llm.encode(PROMPT) == PROMPT
    finally:
        llm.wake_up()
    assert tokens(llm) == before


def test_sleep_2_then_update_weights_folder(sdar, tiny_sdar):
    llm, before = sdar
    llm.sleep(2)
    assert storage_bytes(llm) < 1024  # one element per parameter
    with pytest.raises(AsleepError, match="level 2.*dropped"):
        llm.generate(PROMPT, **REQUEST)
    with pytest.raises(AsleepError, match="needs the weights"):
        llm.wake_up()
    llm.update_weights(tiny_sdar)
    assert llm.is_sleeping and llm.kv_cache.nbytes == 0  # back, the rest still asleep
    with pytest.raises(AsleepError, match=r"level 2\): call wake_up\(\)"):
        llm.generate(PROMPT, **REQUEST)
    llm.wake_up()
    assert tokens(llm) == before


def test_sleep_2_then_wake_up_with_a_folder(sdar, tiny_sdar):
    llm, before = sdar
    llm.sleep(2)
    llm.wake_up(tiny_sdar)
    assert not llm.is_sleeping
    assert tokens(llm) == before


def test_sleep_2_needs_every_weight(sdar, tiny_sdar):
    """After sleep(2) a partial update is refused even with strict=False (the others have no
    values); a refused update leaves the LLM asleep with its weights dropped."""
    from safetensors.torch import load_file

    llm, before = sdar
    w = load_file(str(tiny_sdar / "model.safetensors"))
    del w["model.norm.weight"]
    llm.sleep(2)
    with pytest.raises(WeightsError, match="every weight must be given.*model.norm.weight"):
        llm.update_weights(w, strict=False)
    with pytest.raises(AsleepError, match="needs the weights"):
        llm.wake_up()
    llm.wake_up(tiny_sdar)
    assert tokens(llm) == before


def test_wake_up_1_with_a_folder_takes_its_weights(tiny_llada, tmp_path):
    """wake_up(folder) after sleep(1): the folder's weights, not the CPU copies."""
    from dlrt.checkpoint.make import make_checkpoint

    other = make_checkpoint("tiny-llada", tmp_path / "seed1", seed=1, dtype="float32")
    llm = LLM(tiny_llada, dtype="float32")
    want = tokens(LLM(other, dtype="float32"))
    assert tokens(llm) != want
    llm.sleep(1)
    with pytest.raises(AsleepError, match="level 1"):
        llm.update_weights(other)
    llm.wake_up(other)
    assert tokens(llm) == want


def test_awake_wake_up_does_nothing_and_bad_levels(sdar):
    llm, before = sdar
    llm.wake_up()
    for level in (0, 3, "1", True):
        with pytest.raises(OptionError, match="sleep level"):
            llm.sleep(level)
    assert not llm.is_sleeping and tokens(llm) == before


def test_close_while_asleep(tiny_llada):
    llm = LLM(tiny_llada, dtype="float32")
    llm.sleep(1)
    llm.close()
    with pytest.raises(DlrtError, match="closed"):
        llm.wake_up()


def test_sleep_ends_an_open_stream(sdar):
    """A stream left open when the LLM sleeps ends (as when a newer call supersedes it);
    after a wake the next request is whole."""
    llm, before = sdar
    stream = llm.stream(PROMPT, **{**REQUEST, "block_length": 2})
    next(stream)
    llm.sleep(1)
    llm.wake_up()
    assert list(stream) == []
    assert tokens(llm) == before


def test_sleep_and_wake_inside_inference_mode(tiny_llada):
    """Called inside torch.inference_mode(), sleep and wake still give the parameters plain
    tensors, which a later update outside it copies into in place."""
    llm = LLM(tiny_llada, dtype="float32")
    before = tokens(llm)
    with torch.inference_mode():
        llm.sleep(1)
        llm.wake_up()
        llm.sleep(2)
        llm.wake_up(tiny_llada)
    assert not any(p.is_inference() for p in llm.model.parameters())
    llm.update_weights(tiny_llada)
    assert tokens(llm) == before


def test_wake_up_takes_a_folder_not_a_level(sdar):
    """vLLM's wake_up takes tags, not a level: a number is refused by name, not read as a
    folder called "1"."""
    llm, _ = sdar
    llm.sleep(level=1)
    try:
        with pytest.raises(OptionError, match="a checkpoint folder .str or path., got int 1"):
            llm.wake_up(1)
        assert llm.is_sleeping
    finally:
        llm.wake_up()
