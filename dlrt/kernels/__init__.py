"""Triton kernels (tested against PyTorch references, on the CPU under TRITON_INTERPRET=1)."""
