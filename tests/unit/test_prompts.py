"""`encode_prompt`: text that is not valid Unicode and chat roles the template would drop."""

from __future__ import annotations

import pytest

from dlrt.errors import PromptError
from dlrt.resources import data_path
from dlrt.tokenizer import encode_prompt, load_tokenizer

VOCAB = 151936


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(data_path("sdar-qwen3"))


@pytest.mark.parametrize("chat", [False, True])
def test_lone_surrogate_text(tokenizer, chat):
    with pytest.raises(PromptError, match="not valid Unicode"):
        encode_prompt(tokenizer, "abc\ud800def", VOCAB, chat=chat)


def test_lone_surrogate_in_a_message(tokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "\udfff"}]
    with pytest.raises(PromptError, match=r"message 1 is not valid Unicode"):
        encode_prompt(tokenizer, messages, VOCAB)


@pytest.mark.parametrize("role", ["robot", "User", ""])
def test_unknown_role_is_named(tokenizer, role):
    messages = [{"role": "system", "content": "be brief"}, {"role": role, "content": "hi"}]
    with pytest.raises(PromptError) as e:
        encode_prompt(tokenizer, messages, VOCAB)
    assert f"role {role!r}" in str(e.value) and "message 1" in str(e.value)


def test_known_roles_reach_the_template(tokenizer):
    messages = [{"role": r, "content": f"<{r}>"} for r in ("system", "user", "assistant", "tool")]
    text = tokenizer.decode(encode_prompt(tokenizer, messages, VOCAB))
    for r in ("system", "user", "assistant", "tool"):
        assert f"<{r}>" in text, r


@pytest.mark.parametrize("prompt", ["hello world", [{"role": "user", "content": "hi"}]])
def test_a_tokenizer_larger_than_the_vocabulary_is_named(tokenizer, prompt):
    """A checkpoint whose tokenizer gives ids past its config's vocabulary: a PromptError that
    says so, not an index error inside the embedding."""
    with pytest.raises(PromptError, match=r"outside the model's vocabulary \[0, 512\)"):
        encode_prompt(tokenizer, prompt, 512, chat=False)


def test_a_long_prompt_brings_no_tokenizer_length_warning(caplog, capsys):
    """The engine checks a prompt against the model's context; the tokenizer's own
    model_max_length (the default model's: 1024) made transformers warn "sequence length is
    longer than the specified maximum" first."""
    import logging

    from dlrt.checkpoint.default import default_model_path
    from dlrt.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer(default_model_path())
    with caplog.at_level(logging.WARNING):
        ids = encode_prompt(tok, "x = 1\n" * 2000, 1 << 30)
    assert len(ids) > 1024
    logged = caplog.text + capsys.readouterr().err
    assert "longer than the specified maximum" not in logged, logged
