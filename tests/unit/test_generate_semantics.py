"""Request semantics through `dlrt.LLM` on the tiny SDAR checkpoint (DESIGN §3): prompt
alignment, stop ids, stop strings, `max_new_tokens`, streaming, seeded sampling, chat prompts
and prompt errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dlrt
from dlrt.errors import PromptError
from dlrt.runtime.runner import ModelRunner

B = 4  # the tiny checkpoint's block_size, the block decoder's default block_length
PROMPT = "Hello world"
N = 12


@pytest.fixture(scope="module")
def llm(tiny_sdar):
    return dlrt.LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def ref(llm):
    """The greedy output of PROMPT (block-aligned blocks of a longer run are its prefix)."""
    r = llm.generate(PROMPT, max_new_tokens=N)
    assert r.finish_reason == "length" and len(r.token_ids) == N
    return r


def decode(llm, ids):
    return llm.tokenizer.decode(ids, skip_special_tokens=True)


# --- prompt alignment -------------------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8])
def test_prompt_alignment_and_fixed_prompt_tokens(llm, monkeypatch, p):
    prompt = list(range(1000, 1000 + p))
    max_new = 9
    forwards: list[tuple[list[int], int, int]] = []
    real_forward = ModelRunner.forward

    def spy(runner, tokens, lens, chunk_block, rows=None):
        # (ids, chunk start, whether it only writes K/V: the prefill)
        forwards.append((tokens.tolist(), int(lens[0]), rows is None))
        return real_forward(runner, tokens, lens, chunk_block, rows)

    monkeypatch.setattr(ModelRunner, "forward", spy)
    blocks = list(llm.stream(prompt, max_new_tokens=max_new))

    first = B - p % B
    expected_counts = [first]
    while sum(expected_counts) < max_new:
        expected_counts.append(min(B, max_new - sum(expected_counts)))
    assert [len(b.token_ids) for b in blocks] == expected_counts
    assert [b.index for b in blocks] == list(range(len(blocks)))

    start0 = (p // B) * B
    fixed = prompt[start0:]
    if start0:  # the whole blocks of the prompt are prefilled once
        assert forwards[0] == (prompt[:start0], 0, True)
        assert sum(1 for _, s, _ in forwards if s == 0) == 1
    block0 = [toks for toks, s, w in forwards if s == start0 and not w and len(toks) == B]
    assert block0, forwards
    mask = llm.config.mask_token_id
    for toks in block0:
        assert len(toks) == B and toks[: len(fixed)] == fixed  # prompt tokens never change
    # round 0 sees every free position masked
    assert block0[0][len(fixed):] == [mask] * first
    # committed tokens are never overwritten and every round commits at least one
    for before, after in zip(block0, block0[1:], strict=False):
        for x, y in zip(before, after, strict=True):
            assert x == mask or x == y
        assert after.count(mask) < before.count(mask)
    # block 0's final K/V are written by block 1's round 0, one forward of [block 0 as decided
    # (fixed prompt tokens + output) + block 1 all masked] from block 0's start
    folded = [toks for toks, s, w in forwards if s == start0 and len(toks) == 2 * B]
    assert folded == [fixed + blocks[0].token_ids + [mask] * B]
    assert not any(w for _, s, w in forwards if s > 0)  # no separate K/V-only forwards


# --- stop ids ---------------------------------------------------------------------------------

def _first_occurrences(ids):
    return [j for j in range(len(ids)) if ids[j] not in ids[:j]]


def test_stop_id_truncates_before_it(llm, ref):
    j = max(_first_occurrences(ref.token_ids))
    assert j >= B, "want a stop id outside the first block"
    t = ref.token_ids[j]
    r = llm.generate(PROMPT, max_new_tokens=N, stop=[t])
    assert r.token_ids == ref.token_ids[:j]
    assert (r.finish_reason, r.stop_reason) == ("stop", t)
    assert r.text == decode(llm, ref.token_ids[:j])
    assert len(r.commit_rounds) == j
    assert r.commit_rounds == ref.commit_rounds[:j]


def test_stop_id_past_max_new_tokens_is_not_a_stop(llm, ref):
    # t first appears at j, in the same block as j - 1; with max_new_tokens = j it is cut off
    p = len(ref.prompt_token_ids)
    j = max(j for j in _first_occurrences(ref.token_ids) if (p + j) % B != 0)
    t = ref.token_ids[j]
    r = llm.generate(PROMPT, max_new_tokens=j, stop=[t])
    assert (r.token_ids, r.finish_reason, r.stop_reason) == (ref.token_ids[:j], "length", None)


def test_stop_id_as_first_token_gives_empty_output(llm, ref):
    t = ref.token_ids[0]
    r = llm.generate(PROMPT, max_new_tokens=N, stop=t)
    assert (r.token_ids, r.text, r.finish_reason, r.stop_reason) == ([], "", "stop", t)
    assert len(r.denoise_steps) == 1


def test_eos_ids_stop_unless_ignore_eos(llm, ref, monkeypatch):
    j = max(_first_occurrences(ref.token_ids))
    t = ref.token_ids[j]
    eos = dataclasses.replace(llm.engine.resolved, eos_token_ids=(*llm.eos_token_ids, t))
    monkeypatch.setattr(llm.engine, "resolved", eos)
    r = llm.generate(PROMPT, max_new_tokens=N)
    assert (r.token_ids, r.finish_reason, r.stop_reason) == (ref.token_ids[:j], "stop", t)
    r = llm.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert (r.token_ids, r.finish_reason) == (ref.token_ids, "length")


# --- stop strings -----------------------------------------------------------------------------

def _expect_stop_string(llm, ref, stop):
    full = decode(llm, ref.token_ids)
    assert stop in full
    keep = next(n for n in range(1, N + 1) if stop in decode(llm, ref.token_ids[:n]))
    return full[: full.find(stop)], ref.token_ids[:keep]


def _check_stop_string(llm, ref, stop):
    text, ids = _expect_stop_string(llm, ref, stop)
    r = llm.generate(PROMPT, max_new_tokens=N, stop=[stop])
    assert r.text == text
    assert r.token_ids == ids
    assert (r.finish_reason, r.stop_reason) == ("stop", stop)
    # consistent: the kept tokens are the first ones whose text holds the stop string
    assert decode(llm, r.token_ids).startswith(r.text)
    assert stop in decode(llm, r.token_ids) and stop not in decode(llm, r.token_ids[:-1])
    blocks = list(llm.stream(PROMPT, max_new_tokens=N, stop=[stop]))
    assert "".join(b.text for b in blocks) == text
    assert [t for b in blocks for t in b.token_ids] == ids


def test_stop_string_inside_a_block(llm, ref):
    # the text of a token in the third block, first seen there
    j = max(_first_occurrences(ref.token_ids))
    piece = decode(llm, [ref.token_ids[j]]).strip()
    assert piece and decode(llm, ref.token_ids[:j]).find(piece) < 0
    _check_stop_string(llm, ref, piece)


def test_stop_string_across_a_block_boundary(llm, ref):
    # the end of block 0's text + the start of block 1's: part of it was streamed with block 0
    blocks = list(llm.stream(PROMPT, max_new_tokens=N))
    b0, b1 = blocks[0].text, blocks[1].text
    assert len(b0) >= 3 and len(b1) >= 2
    stop = b0[-3:] + b1[:2]
    _check_stop_string(llm, ref, stop)
    assert llm.generate(PROMPT, max_new_tokens=N, stop=[stop]).text == b0[:-3]


def test_stop_string_not_found_streams_everything(llm, ref):
    r = llm.generate(PROMPT, max_new_tokens=N, stop=["\x00never"])
    assert (r.token_ids, r.text, r.finish_reason) == (ref.token_ids, ref.text, "length")


# --- max_new_tokens and streaming -------------------------------------------------------------

@pytest.mark.parametrize("max_new", [1, 3, 7, 9])
def test_max_new_tokens_not_a_multiple_of_block(llm, ref, max_new):
    r = llm.generate(PROMPT, max_new_tokens=max_new)
    assert len(r.token_ids) == max_new
    assert r.token_ids == ref.token_ids[:max_new]
    assert (r.finish_reason, r.stop_reason) == ("length", None)
    assert len(r.commit_rounds) == max_new
    # the prompt has 2 tokens: the first block makes 2, then blocks of 4
    assert len(r.denoise_steps) == 1 + -(-max(max_new - 2, 0) // B)
    assert r.text == decode(llm, r.token_ids)


def test_stream_concatenates_to_generate(llm, ref):
    blocks = list(llm.stream(PROMPT, max_new_tokens=N))
    assert [t for b in blocks for t in b.token_ids] == ref.token_ids
    assert "".join(b.text for b in blocks) == ref.text
    assert [b.rounds for b in blocks] == ref.denoise_steps
    assert [r for b in blocks for r in b.commit_rounds] == ref.commit_rounds
    assert [b.finish_reason for b in blocks] == [None] * (len(blocks) - 1) + ["length"]
    assert ref.prompt_token_ids == llm.tokenizer.encode(PROMPT)
    for b in blocks:
        assert all(0 <= r < b.rounds for r in b.commit_rounds)


# --- seeded sampling --------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(llm, ref):
    kw = dict(max_new_tokens=8, temperature=1.0, ignore_eos=True)
    a = llm.generate(PROMPT, seed=3, **kw)
    b = llm.generate(PROMPT, seed=3, **kw)
    c = llm.generate(PROMPT, seed=4, **kw)
    assert a.token_ids == b.token_ids and a.commit_rounds == b.commit_rounds
    assert a.token_ids != c.token_ids
    assert a.token_ids != ref.token_ids[:8]
    s = [b.token_ids for b in llm.stream(PROMPT, seed=3, **kw)]
    assert [t for ids in s for t in ids] == a.token_ids


def test_random_strategy_is_seeded(llm):
    kw = dict(max_new_tokens=6, remasking_strategy="random", ignore_eos=True)
    a = llm.generate(PROMPT, seed=11, **kw)
    b = llm.generate(PROMPT, seed=11, **kw)
    assert (a.token_ids, a.commit_rounds) == (b.token_ids, b.commit_rounds)
    orders = {tuple(llm.generate(PROMPT, seed=s, **kw).commit_rounds) for s in range(12, 18)}
    assert len(orders) > 1


# --- chat -------------------------------------------------------------------------------------

def test_chat_messages_go_through_the_chat_template(llm):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"}]
    expected = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if not isinstance(expected, list):
        expected = expected["input_ids"]
    r = llm.generate(messages, max_new_tokens=2)
    assert r.prompt_token_ids == expected
    assert r.prompt_token_ids[-3:] == llm.tokenizer.encode("<|im_start|>assistant\n")
    user = [{"role": "user", "content": PROMPT}]
    r = llm.generate(PROMPT, max_new_tokens=2, chat=True)
    expected = llm.tokenizer.apply_chat_template(user, add_generation_prompt=True)
    if not isinstance(expected, list):
        expected = expected["input_ids"]
    assert r.prompt_token_ids == expected


# --- prompt errors ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def short_llm(tiny_sdar):
    return dlrt.LLM(tiny_sdar, dtype="float32", max_model_len=32)


@pytest.mark.parametrize("prompt, words", [
    ("", "empty"),
    ([], "non-empty"),
    ([1, "two"], "only token ids or only chat messages"),
    ([1, {"role": "user", "content": "x"}], "only token ids or only chat messages"),
    ([5, 151936], "outside the vocabulary"),
    ([-1], "outside the vocabulary"),
    ([{"role": "user"}], "message 0"),
    (7, "non-empty string"),
])
def test_bad_prompts(short_llm, prompt, words):
    with pytest.raises(PromptError, match=words):
        short_llm.generate(prompt, max_new_tokens=2)


def test_prompt_longer_than_context(short_llm):
    with pytest.raises(PromptError, match="32 tokens does not fit the context of 32"):
        short_llm.generate([7] * 32, max_new_tokens=1)
    with pytest.raises(PromptError, match="40 tokens does not fit"):
        short_llm.generate([7] * 40, max_new_tokens=1)


def test_prompt_plus_max_new_tokens_beyond_context(short_llm):
    with pytest.raises(PromptError, match=r"max_new_tokens \(8\).*context of 32"):
        short_llm.generate([7] * 28, max_new_tokens=8)
    # the same prompt fits with fewer new tokens (28 + 4 = 32 positions)
    r = short_llm.generate([7] * 28, max_new_tokens=4)
    assert len(r.token_ids) == 4 and torch.tensor(r.token_ids).lt(151936).all()


def test_new_request_supersedes_an_open_stream(llm):
    """One request at a time: a stream left open is not silently corrupted by another request;
    pulling from it afterwards raises a clear error."""
    from dlrt import DlrtError

    alone = llm.generate(PROMPT, max_new_tokens=12)
    stream = llm.stream(PROMPT, max_new_tokens=12)
    first = next(stream)
    other = llm.generate([5, 6, 7], max_new_tokens=8)
    assert len(other.token_ids) == 8
    with pytest.raises(DlrtError, match="superseded"):
        next(stream)
    assert first.token_ids == alone.token_ids[: len(first.token_ids)]


def test_a_request_started_after_the_last_block_does_not_supersede_it(llm, ref):
    """A stream whose last block has come is finished: a request started by its consumer before
    the loop ends runs, and the stream ends without error."""
    blocks, other = [], None
    for b in llm.stream(PROMPT, max_new_tokens=N):
        blocks.append(b)
        if b.finish_reason:
            other = llm.generate([5, 6, 7], max_new_tokens=4)
    assert blocks[-1].finish_reason == "length"
    assert [t for b in blocks for t in b.token_ids] == ref.token_ids
    assert other is not None and len(other.token_ids) == 4


@pytest.mark.parametrize("stop", [(), ("zzzz-never",)])
def test_detokenisation_cost_is_linear(llm, monkeypatch, stop):
    """Streaming text decodes each token a bounded number of times (not the whole output after
    every block), with and without stop strings."""
    decoded = []
    real = llm.tokenizer.decode

    def counting(ids, *a, **kw):
        decoded.append(len(ids))
        return real(ids, *a, **kw)

    monkeypatch.setattr(llm.tokenizer, "decode", counting)
    r = llm.generate(PROMPT, max_new_tokens=200, stop=list(stop), ignore_eos=True)
    assert len(r.token_ids) == 200
    assert r.text == real(r.token_ids, skip_special_tokens=True)
    assert sum(decoded) < 8 * 200, sum(decoded)  # the old code decoded ~ 200^2 / (2 B) tokens


def test_prefill_in_chunks_gives_the_same_tokens(llm, monkeypatch):
    """A long prompt is prefilled a few whole blocks at a time (bounded memory); the cache and
    so the tokens are those of one prefill forward."""
    from dlrt.runtime import block_decoder

    prompt = [(17 * i + 3) % 5000 for i in range(37)]
    ref = llm.generate(prompt, max_new_tokens=8)
    monkeypatch.setattr(block_decoder, "PREFILL_CHUNK", 2 * B)
    chunked = llm.generate(prompt, max_new_tokens=8)
    assert chunked.token_ids == ref.token_ids
    assert chunked.timings["forwards"] == ref.timings["forwards"] + -(-36 // (2 * B)) - 1


def test_after_close_device_calls_raise_and_host_calls_answer(tiny_sdar):
    """What `LLM.close` says: a later close does nothing, the calls that run the model raise,
    the ones that read only the host (tokenizer, options, context) still answer."""
    from dlrt import DlrtError

    llm = dlrt.LLM(tiny_sdar, dtype="float32")
    llm.close()
    llm.close()
    for call in (lambda: llm.generate(PROMPT, max_new_tokens=4),
                 lambda: next(llm.stream(PROMPT, max_new_tokens=4)),
                 lambda: llm.set_execution_mode("eager"),
                 lambda: llm.collective_rpc(decode, [1])):
        with pytest.raises(DlrtError, match="this LLM is closed"):
            call()
    from dlrt.decoding.options import DecodingOptions

    ids, params = llm.check(PROMPT, max_new_tokens=4, seed=1)
    assert ids == llm.encode(PROMPT)
    assert params == llm.resolve(DecodingOptions(max_new_tokens=4, seed=1))
    assert llm.max_new_tokens_fit(len(ids)) > 0
