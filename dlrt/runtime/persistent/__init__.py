"""The persistent round: one resident worker (CTA) per SM runs a whole block round through a
static plan of tasks (`plan`), checked on the CPU against the layer-by-layer forward by a
PyTorch run of the same tasks (`interpret`), and executed on the GPU by
`csrc/persistent_round.cu` (`kernel`; `round_kernel="persistent"`).

Status: correct on the H200 (its GPU tests) and slower than the layer-by-layer round (SDAR-1.7B
4.2 ms against 1.6, SDAR-8B 11.7 against 4.6: `benchmarks/results/RESULTS.md`) as measured
before the five-step layer (RoPE in the attention tasks, the merge by a head's last split),
the guard-free projection loop and the weight page ring, which are built and not yet run;
`round_kernel="auto"` keeps the layers.

What it serves and what the rest would take:
- dense SDAR models with bf16 / fp32 weights and a KV cache of the model dtype, the block
  decoder's rounds and folded rounds (B and 2B rows, at most 16);
- weight-only FP8 projections (`fp8_activations="weight_only"`): e4m3 rows and their 128-column
  block scales as a second weight type of the projection tasks, from global memory or the
  page ring, dequantised in registers (built, not yet run on a GPU). W8A8 would quantise the
  staged input in the task's prologue and multiply codes (FP8 tensor cores or code-by-code);
  an FP8 KV cache would be dequantised by the attention task as it loads a chunk;
- MoE layers: routing as a task (router GEMV + top-k), then expert tasks whose weight rows are
  known only after routing, so they cannot be prefetched before their dependency: the plan
  would hold a task per (expert, row tile) that exits when the expert is untouched;
- LLaDA canvases: the same dense tasks at the canvas's row count (64-256 rows), which needs
  tensor-core tiles in the projections instead of the CUDA-core rows of a block.
"""
