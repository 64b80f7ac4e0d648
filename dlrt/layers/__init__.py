"""Building blocks shared by the model families: norms, rotary embedding, MLPs, attention layer,
linear layers and their methods (`quant`)."""
