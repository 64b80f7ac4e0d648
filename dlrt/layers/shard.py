"""How a parameter holds one rank's share of its checkpoint tensors (tensor parallelism).

`dlrt.distributed.transform.shard_model` sets `module.shards[leaf] = Shard(...)` on the modules it
cuts; the loader (`dlrt.checkpoint.loader.weight_specs`) reads only those slices of the
checkpoint tensors (safetensors `get_slice`: the rank's rows or columns, never the whole
tensor), and seeded dummy weights take the same slices of the full tensors, so a sharded model
holds exactly the values of the unsharded one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Every checkpoint tensor that fills the parameter is cut into `size` equal pieces along
    `dim` (0: rows, 1: columns) and piece `rank` is read.

    groups: row counts of consecutive row groups of one fused checkpoint tensor (LLaDA2's
        `query_key_value`: the q, k and v rows), each cut separately (dim 0 only).
    key: the checkpoint tensor to read instead of the parameter's own name (a tied LM head
        reads the embedding's rows).
    """

    dim: int
    rank: int
    size: int
    groups: tuple[int, ...] = ()
    key: str | None = None

    def piece(self, n: int) -> slice:
        """Piece `rank` of a length-n dimension (n a multiple of `size`)."""
        step = n // self.size
        return slice(self.rank * step, (self.rank + 1) * step)

    def source(self, shape: tuple[int, ...]) -> tuple[slice, ...]:
        """The index of this rank's piece in a checkpoint tensor of `shape` (no groups)."""
        index = [slice(None)] * len(shape)
        index[self.dim] = self.piece(shape[self.dim])
        return tuple(index)
