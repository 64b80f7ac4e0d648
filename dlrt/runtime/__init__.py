"""The runtime: KV cache, decoders (the block loops) and the engine behind `LLM`."""
