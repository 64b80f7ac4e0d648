"""Attention backends behind one interface; `get_backend(name)` picks one (lazy imports)."""

from dlrt.attention.backend import AttentionBackend, ForwardContext, ForwardMeta, get_backend

__all__ = ["AttentionBackend", "ForwardContext", "ForwardMeta", "get_backend"]
