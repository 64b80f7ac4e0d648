"""Sleep and wake (`Engine.sleep`, `Engine.wake_up`; vLLM's names): an idle engine gives its
device memory back, and takes it again before the next request.

Going to sleep (every level), once the device is idle: the decoder's programs (their state
buffers) and every captured graph are freed and the executor's graph pool forgotten; the
attention backend's workspaces, the runner's buffers (the persistent round's too) and the KV
cache's K and V are freed. Then the weights:

  level 1: each parameter's storage is copied to CPU memory (pinned for a CUDA parameter, so
      waking copies at full speed; plain memory otherwise) and `param.data` points at the
      copy; the `nn.Parameter` objects stay (tied ones stay one);
  level 2: dropped: `param.data` becomes a zero-stride view of one element in CPU memory,
      which keeps the shape and dtype for checking the weights that bring them back
      (`restore_weights`: storage on the parameter's own device again).

Buffers (RoPE frequencies, scalars) go to CPU memory at both levels. Last, the cyclic garbage
is collected (programs hold their own bound methods) and the allocator's cached blocks go back
to the driver (`torch.cuda.empty_cache`). What stays on the device: the page table and FP8
scales of the cache (a few bytes per layer), process-wide kernel workspaces (the split-K
counters, 64 KiB per device) and, under tensor parallelism on GPUs, the peer-to-peer
all-reduce's buffers (made once, collectively, with the group).

Waking: the weights come back to their devices (level 1: copied from the CPU; level 2: they
were brought back by an update, `restore_weights`), the buffers too, the KV cache is allocated
again (zeros) and the persistent round rebuilt on the new addresses. Programs and graphs are
made again on first use (graphs are captured again).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Sleep:
    """An engine's sleep: its level, each parameter once (model order) with its device, the
    CPU copies of level 1 (None at level 2), each buffer's owner, name and device, and
    whether an update brought the weights of level 2 back."""

    level: int
    params: list[tuple[nn.Parameter, torch.device]]
    copies: list[torch.Tensor] | None
    buffers: list[tuple[nn.Module, str, torch.device]] = field(default_factory=list)
    weights_back: bool = False

    @property
    def weights_held(self) -> bool:
        """Whether the weights have values (level 1: on the CPU; level 2: brought back)."""
        return self.level == 1 or self.weights_back


def _unique_params(model: nn.Module) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for p in model.parameters():  # (ties once)
        seen.setdefault(id(p), p)
    return list(seen.values())


def _dropped(p: torch.Tensor) -> torch.Tensor:
    """A tensor of p's shape and dtype that holds one element, in CPU memory (no device
    memory at all)."""
    return torch.empty((), dtype=p.dtype).expand(p.shape)


def release_device(engine) -> None:
    """Free the engine's programs, graphs, workspaces, runner buffers and KV cache (the
    device idle first)."""
    device = engine.config.torch_device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    engine.decoder.release()
    engine.executor.release()
    engine.runner.backend.release()
    engine.runner.release()
    engine.runner.cache.release()


def fall_asleep(engine, level: int) -> Sleep:
    """Put `engine` to sleep at `level` (1 or 2; checked by the caller): see the module
    docstring. Returns the state that `wake` needs."""
    release_device(engine)
    params = [(p, p.device) for p in _unique_params(engine.model)]
    copies = None
    # NOTE: plain tensors even when called inside torch.inference_mode(): an inference
    # tensor could not be updated in place outside it later
    with torch.no_grad(), torch.inference_mode(False):
        if level == 1:
            copies = []
            for p, device in params:
                held = torch.empty(p.shape, dtype=p.dtype, device="cpu",
                                   pin_memory=device.type == "cuda")
                held.copy_(p.data)
                copies.append(held)
                p.data = held
        else:
            for p, _ in params:
                p.data = _dropped(p)
        buffers = []
        for module in engine.model.modules():
            for name, b in module._buffers.items():
                if b is not None:
                    buffers.append((module, name, b.device))
                    module._buffers[name] = b.to("cpu")
    _return_memory(engine.config.torch_device)
    return Sleep(level, params, copies, buffers)


def restore_weights(sleep: Sleep) -> None:
    """Give every parameter storage on its device again (values not set: an update fills
    them); the CPU copies of level 1 are dropped."""
    sleep.copies = None
    with torch.inference_mode(False):
        for p, device in sleep.params:
            p.data = torch.empty(p.shape, dtype=p.dtype, device=device)


def drop_weights(sleep: Sleep) -> None:
    """Drop the weights (level 2's state): when an update that brought them back failed, or
    before a folder's weights replace the CPU copies of level 1."""
    with torch.inference_mode(False):
        for p, _ in sleep.params:
            p.data = _dropped(p)
    sleep.level, sleep.copies, sleep.weights_back = 2, None, False


def wake(engine, sleep: Sleep) -> None:
    """Bring the weights (level 1: from their CPU copies; level 2: already back), the buffers
    and the KV cache back, and rebuild the persistent round."""
    assert sleep.weights_held, "the weights of level 2 come back through an update first"
    with torch.no_grad(), torch.inference_mode(False):
        if sleep.copies is not None:
            for (p, device), held in zip(sleep.params, sleep.copies, strict=True):
                p.data = held.to(device, non_blocking=True)
            sleep.copies = None
        for module, name, device in sleep.buffers:
            module._buffers[name] = module._buffers[name].to(device)
        engine.runner.cache.restore()
        engine.runner.restore()
    device = engine.config.torch_device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _return_memory(device: torch.device) -> None:
    gc.collect()  # programs are cycles (their phases are their own bound methods)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
