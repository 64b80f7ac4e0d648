"""The checks that the ranks (tensor- or data-parallel) would build the same model: the same
checkpoint (a fingerprint of its config, names and sampled bytes) and the same engine options,
before any weight loads; and after the load, that every rank loaded (all go on, or all
raise)."""

from __future__ import annotations

import hashlib

from dlrt.distributed.calls import describe
from dlrt.errors import CheckpointError, OptionError, RankError

SAMPLE_BYTES = 1 << 16  # bytes read from each weight file's start, middle and end


def checkpoint_fingerprint(folder) -> str:
    """A short hash of what a rank is about to load: config.json, every tensor's name and
    file, and each weight file's size and three 64 KiB samples of its bytes (two checkpoints
    of one config with other weights differ; the files are not read whole)."""
    h = hashlib.sha256((folder.path / "config.json").read_bytes())
    for key, path in sorted(folder.tensor_files.items()):
        h.update(f"{key}@{path.name}".encode())
    for path in sorted(set(folder.tensor_files.values())):
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            for at in (0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)):
                f.seek(at)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def check_ranks_agree(ranks, folder, options: dict) -> None:
    """Raise before any weight loads when the ranks would build different models: another
    checkpoint (CheckpointError naming each rank's folder) or other engine options
    (OptionError naming the option and each rank's value). `options`: the resolved engine
    options that must match (the device and the folder's path may differ)."""
    every = ranks.gather_at_load((str(folder.path), checkpoint_fingerprint(folder), options))
    if any(fp != every[0][1] for _, fp, _ in every):
        listed = "; ".join(f"rank {r}: {p} ({fp})" for r, (p, fp, _) in enumerate(every))
        raise CheckpointError(f"the ranks disagree on the checkpoint "
                              f"(config.json or weights differ): {listed}")
    for name in options:
        values = [o.get(name) for _, _, o in every]
        if any(v != values[0] for v in values):
            listed = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise OptionError(f"the ranks disagree on {name} ({listed}); "
                              "every rank must create LLM(...) with the same arguments")



def check_all_loaded(ranks, error: BaseException | None) -> None:
    """Every rank's outcome of the load (`error`: this rank's failure, None when it loaded),
    exchanged over the load-time channel (`Ranks.gather_at_load`: a rank that never arrives
    is a DlrtError after LOAD_TIMEOUT, not a hang): the ranks go on together or raise
    together. Raises `error` itself on the rank that failed, RankError naming each rank that
    failed and its error on the others."""
    every = ranks.gather_at_load(None if error is None else describe(error))
    if error is not None:
        raise error
    failed = "; ".join(f"rank {r} failed to load the model: {e}"
                       for r, e in enumerate(every) if e)
    if failed:
        raise RankError(failed)
