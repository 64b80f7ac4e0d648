"""Training the default model: the Python standard library as a corpus (`corpus`), a byte-level
BPE tokenizer trained on it (`tokenizer`), a plain-PyTorch SDAR model with autograd (`model`),
SDAR's block-diffusion objective (`objective`), the loop (`loop`) and the Hugging Face folder
it writes (`export`). `tools/train_default.py` is the command; nothing in the runtime imports
this package."""
