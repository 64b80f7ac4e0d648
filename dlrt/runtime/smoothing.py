"""dInfer's iteration smoothing on the device (inclusionAI/dInfer `generate_uniform.py`:
`IterationSmooth`, `IterSmoothWithVicinityCache`; the models' `H2Embed`), shared by the
programs that run it (`canvas_program`, `canvas_cache`, `block_decoder`).

Forward i of a request (i counts every forward that commits: rounds, and a cached canvas's
refresh) commits at the bar max(1 - threshold_decay * i, threshold) and leaves, at the
positions it saw that are still masked after its commit, w_i * softmax(logits) @ E with
w_i = min(cont_weight_init + cont_weight_growth * i, cont_weight) (0 at every other position
it saw); the next forward that sees a position adds that to its token embedding (the model's
`embeds_add`). Positions no forward has seen yet add 0 (dInfer's plain embedding).
"""

from __future__ import annotations

import torch

from dlrt.errors import OptionError
from dlrt.models.registry import family
from dlrt.runtime.runner import ModelRunner


def input_embedding(model: torch.nn.Module) -> torch.Tensor:
    """The token-embedding weight [V, H] of a model (its family's `embedding` parameter)."""
    return model.get_parameter(family(model.config.family).embedding)


class SoftFeedback:
    """The soft embeddings of `n` positions (`soft` [n, H] in the model dtype, 0 where
    nothing is added) and the request's schedule: `rounds_run` 0-d int64 (forwards run by the
    request), `values` [5] fp64 (threshold, decay, init, growth, cont_weight), `weight` 0-d
    (this forward's w, the model dtype). Pure tensor code after `set_request`.

    Raises:
        OptionError: built over a runner with a vocabulary-parallel head (tensor parallelism:
            a rank holds a shard of the logits).
    """

    def __init__(self, runner: ModelRunner, n: int):
        if runner.vocab is not None:
            raise OptionError("smoothing=True is not built with tensor parallelism (a rank "
                              "holds a shard of the logits); leave it unset")
        self.ops = runner.ops
        self.embed = input_embedding(runner.model)  # [V, H]
        dev, dtype = runner.device, self.embed.dtype
        self.soft = torch.zeros(n, self.embed.shape[1], dtype=dtype, device=dev)
        self.rounds_run = torch.zeros((), dtype=torch.int64, device=dev)
        self.values = torch.zeros(5, dtype=torch.float64, device=dev)
        self.weight = torch.zeros((), dtype=dtype, device=dev)

    def set_request(self, threshold: float, smoothing) -> None:
        """A request's start: its bar and `smoothing` values
        (`dlrt.decoding.options.Smoothing`), no forward run, nothing to add."""
        s = smoothing
        self.values.copy_(torch.tensor([threshold, s.threshold_decay, s.cont_weight_init,
                                        s.cont_weight_growth, s.cont_weight],
                                       dtype=torch.float64))
        self.rounds_run.zero_()
        self.soft.zero_()

    def begin(self, bar: torch.Tensor) -> None:
        """Before forward i: its bar into `bar` (the state's threshold, fp32) and its w."""
        threshold, decay, init, growth, top = self.values.unbind()
        i = self.rounds_run.double()
        bar.copy_(torch.maximum(1.0 - i * decay, threshold))
        self.weight.copy_(torch.minimum(init + growth * i, top))

    def feed(self, logits: torch.Tensor, masked: torch.Tensor,
             at: slice | torch.Tensor) -> None:
        """After forward i's commit: `soft[at]` = w * softmax(logits) @ E where `masked`,
        else 0 (logits [n, V] of those positions, masked [n] bool after the commit; `at` a
        slice or [n] int64 slots); the request has run one more forward."""
        soft = self.ops.soft_embedding(logits, self.embed)  # [n, H]
        value = torch.where(masked[:, None], self.weight * soft, 0.0)
        if isinstance(at, slice):
            self.soft[at] = value
        else:
            self.soft.index_copy_(0, at, value)
        self.rounds_run.add_(1)

    def buffers(self) -> list[torch.Tensor]:
        return [self.soft, self.rounds_run, self.values, self.weight]
