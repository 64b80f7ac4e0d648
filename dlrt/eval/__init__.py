"""Evaluation through EleutherAI's lm-evaluation-harness: the masked-diffusion log-likelihood
estimator (`likelihood`), the model arguments (`model_args`), the harness's `dlrt` model
(`harness`, which imports lm-eval) and the `dlrt eval` command (`cli`)."""
