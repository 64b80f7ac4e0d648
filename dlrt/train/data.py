"""Token streams of the corpus splits, and the windows cut from them.

Each split is one stream: the files in path order, each followed by end-of-text. Training
windows start at uniformly drawn offsets; held-out windows are evenly spaced, so every
evaluation reads the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrt.train.corpus import Corpus
from dlrt.train.tokenizer import encode_files, special_ids, train_tokenizer


@dataclass
class Streams:
    tokenizer: object  # tokenizers.Tokenizer
    special: dict[str, int]  # eos, mask, pad
    vocab_size: int  # entries of the tokenizer
    train: torch.Tensor  # [T] int64 on the training device
    held_out: torch.Tensor  # [H] int64
    top_token: int  # the most frequent training token (the unigram baseline's guess)


def prepare(corpus: Corpus, vocab_size: int, seq_len: int, device: torch.device) -> Streams:
    """Train the tokenizer on the training files and encode both splits.

    Raises:
        ValueError: no held-out file, or a split shorter than one window.
    """
    if not corpus.held_out:
        raise ValueError(f"no held-out file among the {len(corpus.train)} of {corpus.root}: "
                         "raise held_out_share")
    train_texts = [t for _, t in corpus.train]
    tok = train_tokenizer(train_texts, vocab_size)
    special = special_ids(tok)
    streams = []
    for texts in (train_texts, [t for _, t in corpus.held_out]):
        ids = torch.tensor(encode_files(tok, texts, special["eos"]), dtype=torch.int64)
        if ids.numel() <= seq_len:
            raise ValueError(f"a split of {corpus.root} has {ids.numel()} tokens, fewer than "
                             f"one window of {seq_len}")
        streams.append(ids)
    top = int(torch.bincount(streams[0]).argmax())
    return Streams(tok, special, tok.get_vocab_size(), streams[0].to(device),
                   streams[1].to(device), top)


def sample_windows(stream: torch.Tensor, rows: int, n: int, gen: torch.Generator
                   ) -> torch.Tensor:
    """[rows, n] windows of `stream` at offsets drawn with `gen` (on the stream's device)."""
    starts = torch.randint(0, stream.numel() - n + 1, (rows, 1), device=stream.device,
                           generator=gen)
    return stream[starts + torch.arange(n, device=stream.device)]


def held_out_windows(data: Streams, cfg) -> torch.Tensor:
    """[W, seq_len] evenly spaced held-out windows, W = min(eval_windows, what fits)."""
    n = cfg.seq_len
    count = max(1, min(cfg.eval_windows, data.held_out.numel() // n))
    starts = torch.linspace(0, data.held_out.numel() - n, count).long().to(data.held_out.device)
    return data.held_out[starts[:, None] + torch.arange(n, device=data.held_out.device)]
