"""Frozen configs: `model` (a checkpoint's architecture), `hf` (reading `config.json` fields),
`engine` (every engine option of `LLM`, resolved once)."""
