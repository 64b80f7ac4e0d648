"""The persistent round: one resident worker (CTA) per SM runs a whole block round through a
static plan of tasks (`plan`), checked on the CPU against the layer-by-layer forward by a
PyTorch run of the same tasks (`interpret`). The CUDA kernel that executes the plan is not
part of the package yet; rounds run layer by layer."""
