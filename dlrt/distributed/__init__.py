"""Multi-process plumbing (torchrun): rank discovery and the control channel between ranks."""
