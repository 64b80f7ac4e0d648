"""LLaDA (ML-GSAI/LLaDA, OLMo-style names): bidirectional MHA transformer; dLLM-Var shares it."""
