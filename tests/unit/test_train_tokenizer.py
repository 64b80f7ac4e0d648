"""The trained tokenizer: byte-level BPE with mask, end-of-text and padding tokens, loaded
through AutoTokenizer and dlrt's loader like a checkpoint's, with a code-prompt chat template."""

from __future__ import annotations

import json

import pytest

from dlrt.tokenizer import encode_prompt, load_tokenizer
from dlrt.train.tokenizer import (
    EOS,
    MASK,
    PAD,
    encode_files,
    save_tokenizer,
    special_ids,
    train_tokenizer,
)

TEXTS = [f"def square_{i}(x):\n    \"\"\"Return x squared.\"\"\"\n    return x * x  # {i}\n"
         for i in range(40)]
SAMPLE = "class Point:\n    def __init__(self, x):\n        self.x = x  # café ✓\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = train_tokenizer(TEXTS, vocab_size=300)
    out = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok, out, model_max_length=256)
    return out


def test_trains_within_the_vocabulary():
    tok = train_tokenizer(TEXTS, vocab_size=300)
    assert 256 + 3 < tok.get_vocab_size() <= 300
    assert special_ids(tok) == {"eos": 0, "mask": 1, "pad": 2}
    ids = encode_files(tok, TEXTS[:2], eos_id=0)
    assert ids.count(0) == 2 and ids[-1] == 0
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(TEXTS, vocab_size=100)


def test_round_trip_through_auto_tokenizer(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    assert (tok.eos_token, tok.mask_token, tok.pad_token) == (EOS, MASK, PAD)
    assert (tok.eos_token_id, tok.mask_token_id, tok.pad_token_id) == (0, 1, 2)
    ids = tok.encode(SAMPLE, add_special_tokens=False)
    assert tok.decode(ids) == SAMPLE  # bytes: any text round-trips, spacing kept
    assert tok.decode([*ids, 1, 0, 2], skip_special_tokens=True) == SAMPLE
    assert tok.encode(MASK, add_special_tokens=False) == [1]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_dlrt_loader_and_chat_template(folder):
    tok = load_tokenizer(folder)
    assert tok.mask_token_id == 1
    messages = [{"role": "system", "content": "Python only."},
                {"role": "user", "content": "Reverse a string.\nKeep it short."}]
    ids = encode_prompt(tok, messages, vocab_size=300)
    assert tok.decode(ids) == "# Python only.\n# Reverse a string.\n# Keep it short.\n"
    chat = encode_prompt(tok, "Sort a list.", vocab_size=300, chat=True)
    assert tok.decode(chat) == "# Sort a list.\n"
    assert tok.apply_chat_template([{"role": "user", "content": "add"},
                                    {"role": "assistant", "content": "def add(a, b):"}],
                                   tokenize=False) == "# add\ndef add(a, b):\n"
