"""The Triton MoE method (kernels in `dlrt.kernels.moe`)."""

from dlrt.layers.moe.reference import ReferenceMoE


class TritonMoE(ReferenceMoE):
    name = "triton"
