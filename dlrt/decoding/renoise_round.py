"""One round of renoising (uniform-state) decoding, DiffusionGemma's, on a canvas's static
device state.

`CanvasState` holds the buffers of one canvas (fixed shapes, allocated once, so captured graphs
read and write the same addresses for every canvas and request) and the request's values as
0-d tensors (one graph serves every value). `start_canvas` draws a canvas's first tokens;
`denoise_canvas_round` takes one round's logits and updates the state in place with no host
sync. A host loop (or a captured WHILE node) runs rounds while `flag` is 1:

    state.set_values(params)                   # once per request
    state.start_canvas(positions)              # per canvas, after the encoder pass
    while state.flag.item():                   # the host loop's one sync per round
        logits = forward(state.canvas, state.self_cond, state.round > 0)   # [n, V]
        denoise_canvas_round(logits, state, positions)
    committed = state.argmax                   # the argmax canvas of the last round

Per round r (transformers' `DiffusionGemmaGenerationMixin._denoising_step`): the logits are
divided by the schedule's temperature (`renoise.schedule_temperature`); the denoiser samples
every position from their softmax; the positions `renoise.accept_by_entropy` picks take the
sample and every other one a fresh uniform token; the argmax canvas of the divided logits and
the stop test (`renoise.should_stop`) close the round. The divided logits are the next
round's self-conditioning signal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlrt.decoding.logprobs import TokenLogprobs, log_probs
from dlrt.decoding.options import DecodingParams
from dlrt.decoding.renoise import (
    accept_by_entropy,
    denoiser_draw,
    draw_tokens,
    schedule_temperature,
    should_stop,
    stable_rounds,
)

# the ops table's `denoiser_draw`: (logits [n, V], temperature 0-d fp32, seed, round_idx,
# positions [n], divided [n, V] or None) -> (sample [n] int64, argmax [n] int64, entropy [n] fp32)
DrawOp = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class CanvasState:
    """Buffers of a canvas of n positions over a vocabulary of V tokens.

    canvas [n] int64: the tokens the next round's forward reads (first the uniform draw, then
        each round's accepted samples and renoised tokens).
    argmax [n] int64: the last round's argmax canvas (of the divided logits), which a canvas
        commits when its rounds end.
    accepted [n] bool: the positions the last round accepted.
    self_cond [n, V] (`self_cond_dtype`, the model's embedding dtype): the last round's logits
        divided by its temperature, which the reference feeds back as its
        `self_conditioning_logits` (cast to the embedding dtype; the model takes their fp32
        softmax). Zeros before the first round, where the reference feeds nothing (zero soft
        embeddings): a forward uses it only where `round > 0`.
    round 0-d int64 (rounds run on this canvas), stable 0-d int64 (`renoise.stable_rounds`),
    stopped 0-d bool (the last round passed the stop test), fault 0-d bool (a round met a
    non-finite entropy: NaN or infinite logits), flag [1] int32 (1 = run another round: not
    stopped, round < max_denoising_steps, no fault).
    The request's values, 0-d (`set_values`): seed int64, steps int64 (max_denoising_steps),
    entropy_bound fp64, t_min fp64, t_max fp64, stability_threshold int64,
    confidence_threshold fp64 (fp64 hold a Python float exactly; the rules round them as the
    reference's arithmetic does).
    logprobs: with `logprobs`, the `TokenLogprobs` of the last round's argmax canvas (every
    round writes every position); None otherwise.
    """

    def __init__(self, n: int, vocab: int, device: torch.device,
                 self_cond_dtype: torch.dtype = torch.float32, logprobs: bool = False):
        self.n, self.vocab, self.device = n, vocab, device
        i64 = dict(dtype=torch.int64, device=device)
        f64 = dict(dtype=torch.float64, device=device)
        self.canvas = torch.zeros(n, **i64)
        self.argmax = torch.zeros(n, **i64)
        self.accepted = torch.zeros(n, dtype=torch.bool, device=device)
        self.self_cond = torch.zeros(n, vocab, dtype=self_cond_dtype, device=device)
        self.round = torch.zeros((), **i64)
        self.stable = torch.zeros((), **i64)
        self.stopped = torch.zeros((), dtype=torch.bool, device=device)
        self.fault = torch.zeros((), dtype=torch.bool, device=device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.seed = torch.zeros((), **i64)
        self.steps = torch.ones((), **i64)
        self.entropy_bound = torch.zeros((), **f64)
        self.t_min = torch.zeros((), **f64)
        self.t_max = torch.ones((), **f64)
        self.stability_threshold = torch.zeros((), **i64)
        self.confidence_threshold = torch.zeros((), **f64)
        self.logprobs = TokenLogprobs(n, device) if logprobs else None

    def tensors(self) -> list[torch.Tensor]:
        return [self.canvas, self.argmax, self.accepted, self.self_cond, self.round,
                self.stable, self.stopped, self.fault, self.flag, self.seed, self.steps,
                self.entropy_bound, self.t_min, self.t_max, self.stability_threshold,
                self.confidence_threshold,
                *([] if self.logprobs is None else self.logprobs.tensors())]

    def set_values(self, params: DecodingParams) -> None:
        """The request's seed and renoising values (host -> device, stream ordered).

        Raises:
            ValueError: `params` of a family that does not renoise (`params.renoise` None).
        """
        p = params.renoise
        if p is None:
            raise ValueError("set_values needs the params of a renoising family "
                             "(DecodingParams.renoise is None)")
        for t, v in ((self.seed, params.sampling.seed), (self.steps, p.max_denoising_steps),
                     (self.entropy_bound, p.entropy_bound), (self.t_min, p.t_min),
                     (self.t_max, p.t_max), (self.stability_threshold, p.stability_threshold),
                     (self.confidence_threshold, p.confidence_threshold)):
            t.fill_(v)

    def start_canvas(self, positions: torch.Tensor) -> None:
        """A new canvas at the absolute positions [n] int64 (device only): its uniform draw
        (`renoise.draw_tokens`, key 0), no round run, no self-conditioning, flag 1."""
        self.canvas.copy_(draw_tokens(self.seed, 0, positions, self.vocab))
        self.argmax.copy_(self.canvas)
        self.accepted.zero_()
        self.self_cond.zero_()
        self.round.zero_()
        self.stable.zero_()
        self.stopped.zero_()
        self.fault.zero_()
        self.update_flag()

    def update_flag(self) -> None:
        """Whether to run another round (device only): not stopped, rounds run <
        max_denoising_steps, no fault."""
        run = ~self.stopped & (self.round < self.steps) & ~self.fault
        self.flag.copy_(run.reshape(1))


def denoise_canvas_round(logits: torch.Tensor, state: CanvasState, positions: torch.Tensor,
                         draw_op: DrawOp = denoiser_draw) -> None:
    """Run round `state.round` of the canvas on its logits, in place (device only).

    Writes the canvas (accepted samples, renoised elsewhere: `renoise.draw_tokens` with key
    round + 1), the accepted positions, the argmax canvas, the self-conditioning signal (the
    divided logits, written by the draw), the stability count, the stop test, the fault bit,
    round + 1 and the flag; with `state.logprobs`, the argmax canvas's log-probabilities
    under the softmax of the divided logits (fp32, `logprobs.log_probs`).

    Args:
        logits: [n, V] logits of the canvas (any float dtype; divided in fp32).
        state: the canvas's `CanvasState` (n positions, V tokens).
        positions: [n] int64 absolute positions of the canvas (keys of the noise).
        draw_op: the ops table's `denoiser_draw`, given the logits, the round's temperature
            (0-d fp32 on the device) and `state.self_cond` to write: sample, argmax and
            entropy of the divided logits. Default: `renoise.denoiser_draw`, the PyTorch
            formulas (the reference ops'); the Triton kernel (`dlrt.kernels.denoiser`) reads
            the logits once, and its sample can differ only where two race scores are within
            a few fp32 ulps.
    """
    r = state.round
    t = schedule_temperature(state.t_min, state.t_max, state.steps, r)  # 0-d fp32
    # NOTE: the forward that read state.self_cond has run; the draw overwrites it
    sample, argmax, entropy = draw_op(logits, t, state.seed, r, positions, state.self_cond)
    accepted = accept_by_entropy(entropy, state.entropy_bound)
    noise = draw_tokens(state.seed, r + 1, positions, state.vocab)
    stable = stable_rounds(argmax, state.argmax, state.stable, r)
    state.stopped.copy_(should_stop(stable, entropy, state.stability_threshold,
                                    state.confidence_threshold))
    state.fault |= ~torch.isfinite(entropy).all()
    if state.logprobs is not None:
        state.logprobs.record(None, log_probs(logits.float() / t, argmax))
    state.canvas.copy_(torch.where(accepted, sample, noise))
    state.accepted.copy_(accepted)
    state.argmax.copy_(argmax)
    state.stable.copy_(stable)
    state.round.add_(1)
    state.update_flag()
