"""Times a renoising round's vocabulary-sized ops and one MoE layer at DiffusionGemma-26B-A4B's
real shapes (canvas 256, V 262144, d 2816; E 128, top-8, I 704), each against its PyTorch
reference, with the bytes each must move and the copy bandwidth measured in the same run.
Usage: python3 benchmarks/device/renoise_ops.py [OUT.json]   (from the checkout's root, GPU)
Options in the environment: SWEEP=1 also times other block layouts of the two kernels.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from dlrt.bench.step import copy_bandwidth
from dlrt.kernels import denoiser as kd
from dlrt.kernels.soft_embedding import SoftEmbeddingConfig, soft_embedding, soft_embedding_config
from dlrt.ops import reference
from dlrt.tuning.timing import event_us, graph_us

N, V, D = 256, 262144, 2816
E, K, INTER = 128, 8, 704
DEV = torch.device("cuda")
rows = []


def record(op, impl, us, nbytes, bw, **extra):
    rows.append(dict(op=op, impl=impl, us=round(us, 1), GBps=round(nbytes / us / 1e3, 1),
                     floor_us=round(nbytes / bw * 1e6, 1), **extra))
    print(f"{op:16s} {impl:40s} {us:9.1f} us  {nbytes / us / 1e3:7.1f} GB/s  "
          f"floor {nbytes / bw * 1e6:7.1f} us", flush=True)


def main() -> None:
    torch.manual_seed(0)
    bw = copy_bandwidth(DEV)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    logits = 30 * torch.tanh(torch.randn(N, V, device=DEV) * 0.2)  # fp32, soft-capped
    t = torch.tensor(0.4, device=DEV)
    pos = torch.arange(1000, 1000 + N, device=DEV)
    seed = torch.tensor(3, device=DEV)
    rnd = torch.tensor(2, device=DEV)
    signal = torch.empty(N, V, dtype=torch.bfloat16, device=DEV)

    # denoiser draw: read fp32 logits, write the bf16 divided logits
    nbytes = N * V * (4 + 2)
    record("denoiser_draw", "reference (PyTorch)",
           graph_us(lambda: reference.denoiser_draw(logits, t, seed, rnd, pos, signal), 2),
           nbytes, bw)
    layouts = [(kd.BLOCK, kd.CHUNKS)]
    if os.environ.get("SWEEP"):
        layouts += [(1024, 1), (1024, 2), (1024, 8), (2048, 4), (512, 8), (1024, 16)]
    for block, chunks in layouts:
        kd.BLOCK, kd.CHUNKS = block, chunks
        us = graph_us(lambda: kd.denoiser_draw(logits, t, seed, rnd, pos, signal))
        record("denoiser_draw", f"triton BLOCK={block} CHUNKS={chunks}", us, nbytes, bw)
    kd.BLOCK, kd.CHUNKS = layouts[0]

    # soft embedding: read the bf16 signal and E, write [N, D]
    w = (torch.randn(V, D, device=DEV) * 0.02).bfloat16()
    signal.copy_((logits / t).bfloat16())
    nbytes = N * V * 2 + V * D * 2 + N * D * 2
    flops = 2 * N * V * D
    us = graph_us(lambda: reference.soft_embedding(signal, w, 53.0), 2)
    record("soft_embedding", "reference (PyTorch)", us, nbytes, bw,
           TFLOPs=round(flops / us / 1e6, 1))
    configs = [soft_embedding_config(N, V, D)]
    if os.environ.get("SWEEP"):
        configs += [SoftEmbeddingConfig(128, 128, 64, s, 8, 3) for s in (6, 12, 24)]
        configs += [SoftEmbeddingConfig(128, 256, 64, 12, 8, 3),
                    SoftEmbeddingConfig(64, 128, 64, 6, 4, 3),
                    SoftEmbeddingConfig(128, 128, 32, 6, 4, 4),
                    SoftEmbeddingConfig(256, 128, 64, 12, 8, 3),
                    SoftEmbeddingConfig(128, 128, 128, 6, 8, 2)]
    for cfg in configs:
        try:
            us = graph_us(lambda c=cfg: soft_embedding(signal, w, 53.0, c))
        except Exception as e:  # a layout the device cannot hold (shared memory)
            print(f"soft_embedding {cfg}: {type(e).__name__}: {str(e)[:120]}")
            continue
        record("soft_embedding", f"triton {cfg.block_m}x{cfg.block_d}x{cfg.block_v} "
               f"s{cfg.splits} w{cfg.warps} st{cfg.stages}", us, nbytes, bw,
               TFLOPs=round(flops / us / 1e6, 1))

    # one MoE layer's routed experts (router + experts), bf16
    from dlrt.layers.moe import StackedExperts
    from dlrt.layers.moe.reference import ReferenceMoE
    from dlrt.layers.moe.triton import TritonMoE
    from dlrt.models.diffusion_gemma.config import diffusion_gemma_config
    from dlrt.models.diffusion_gemma.layers import DiffusionGemmaRouter

    c = diffusion_gemma_config(json.load(open("dlrt/data/configs/DiffusionGemma-26B-A4B-it/"
                                              "config.json")))
    router = DiffusionGemmaRouter(c).to(DEV, torch.bfloat16)
    with torch.no_grad():
        router.proj.weight.normal_()
    ex = StackedExperts(E, D, INTER, activation="gelu_pytorch_tanh", stacked=True)
    ex = ex.to(DEV, torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        ex.w13.normal_(std=D ** -0.5)
        ex.w2.normal_(std=INTER ** -0.5)
    layer = type("L", (), {"experts": ex})()
    x = torch.randn(N, D, device=DEV, dtype=torch.bfloat16)
    touched = int(router(x, ReferenceMoE())[1].unique().numel())
    nbytes = touched * 3 * D * INTER * 2
    triton_moe, ref_moe = TritonMoE(), ReferenceMoE()
    us = graph_us(lambda: triton_moe.apply(layer, x, *router(x, triton_moe)))
    record("moe_layer", "triton (graph)", us, nbytes, bw, experts_touched=touched)
    # NOTE: the reference loops over the chosen experts here (a host sync: eager only)
    us = event_us(lambda: ref_moe.apply(layer, x, *router(x, ref_moe)))
    record("moe_layer", "reference (PyTorch, eager)", us, nbytes, bw, experts_touched=touched)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_GBps=bw / 1e9, rows=rows),
                      f, indent=1)


if __name__ == "__main__":
    main()
