"""Hugging Face hub repo ids as models: `--model JetLM/SDAR-1.7B-Chat` is fetched (or found in
the local hub cache) with `huggingface_hub.snapshot_download`, as vLLM and transformers do.

Only what dlrt reads is fetched (`PATTERNS`: configs, safetensors weights, tokenizer files and
chat templates), never code or pickled weights. `HF_HUB_OFFLINE=1` (and `HF_HUB_CACHE` /
`HF_HOME`) are honoured by huggingface_hub itself: offline, a cached copy is used and nothing
is downloaded.
"""

from __future__ import annotations

import re
from pathlib import Path

from dlrt.errors import CheckpointError

PATTERNS = ("*.json", "*.safetensors", "*.jinja", "tokenizer.model", "merges.txt", "vocab.txt")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")


def is_repo_id(name: str) -> bool:
    """Whether `name` reads as a hub repo id ("org/name": one slash, no path syntax)."""
    return bool(_REPO_ID.match(name)) and ".." not in name and not name.endswith(".")


def download(repo_id: str, weights: bool = True) -> Path:
    """The local folder of `repo_id`'s files (`PATTERNS`; without `*.safetensors` when
    `weights` is False), downloaded or from the hub cache.

    Raises:
        CheckpointError: huggingface_hub is not installed; the repo does not exist (or is
            gated / private without a token); the hub cannot be reached and no cached copy
            exists (the message says how to download it first).
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError as e:
        raise CheckpointError(f"{repo_id} is not a local folder; loading it from the Hugging "
                              "Face hub needs huggingface_hub (pip install huggingface_hub)") from e
    patterns = [p for p in PATTERNS if weights or p != "*.safetensors"]
    how = (f"download it where the hub is reachable, e.g. `hf download {repo_id} --include "
           + " ".join(f"'{p}'" for p in patterns)
           + "`, then pass the folder (or set HF_HUB_OFFLINE=1 to use the hub cache)")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except GatedRepoError as e:
        raise CheckpointError(f"{repo_id} is a gated Hugging Face repo: accept its terms and log "
                              f"in (hf auth login), or {how}") from e
    except RepositoryNotFoundError as e:
        raise CheckpointError(f"{repo_id} is neither a local folder nor a Hugging Face repo "
                              "(not found, or private without a token)") from e
    except LocalEntryNotFoundError as e:
        raise CheckpointError(f"{repo_id} is not a local folder, and the Hugging Face hub "
                              f"cannot be reached nor holds a cached copy: {how}") from e
    except OSError as e:  # connection errors and the like
        raise CheckpointError(f"{repo_id}: the Hugging Face hub cannot be reached "
                              f"({type(e).__name__}); {how}") from e
