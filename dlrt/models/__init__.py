"""Model families in plain PyTorch, one folder each; `registry` looks them up by model_type."""
