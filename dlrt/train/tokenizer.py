"""A byte-level BPE tokenizer for Python source, trained with Hugging Face `tokenizers`.

The folder it writes holds `tokenizer.json` and a `tokenizer_config.json` naming the class
`PreTrainedTokenizerFast` (known to transformers 4 and 5), so `AutoTokenizer.from_pretrained`
and `dlrt.tokenizer.load_tokenizer` read it like any checkpoint's tokenizer. Special tokens
come first: end-of-text (between files), mask (block diffusion), padding. The chat template
turns messages into a code prompt: user and system text become `# ` comment lines, assistant
text is code as it stands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

EOS, MASK, PAD = "<|endoftext|>", "<|mask|>", "<|pad|>"
SPECIAL_TOKENS = (EOS, MASK, PAD)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] }}\n"
    "{% else %}# {{ message['content'] | replace('\\n', '\\n# ') }}\n"
    "{% endif %}{% endfor %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2):
    """A `tokenizers.Tokenizer` (byte-level BPE, at most `vocab_size` entries, the special
    tokens at ids 0, 1, 2) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} cannot hold the 256 bytes and "
                         f"{len(SPECIAL_TOKENS)} special tokens")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def special_ids(tok) -> dict[str, int]:
    """{"eos": id, "mask": id, "pad": id} of a trained tokenizer."""
    return {name: tok.token_to_id(token) for name, token in
            zip(("eos", "mask", "pad"), SPECIAL_TOKENS, strict=True)}


def save_tokenizer(tok, folder: str | Path, model_max_length: int) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` (special tokens, chat template)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS, "mask_token": MASK, "pad_token": PAD,
        "clean_up_tokenization_spaces": False,  # NOTE: source text must decode as it was
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_files(tok, texts: list[str], eos_id: int) -> list[int]:
    """One token stream: each text's ids followed by end-of-text."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return ids
