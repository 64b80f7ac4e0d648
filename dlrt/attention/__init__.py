"""Attention: the paged KV cache (`kv_cache`), the backend interface and its hooks (`base`),
the backends (`sdpa`, `triton`, `flashinfer`) and their registry (`registry`)."""
