"""Multi-process plumbing (torchrun): rank discovery, the control channel between ranks, rank
0's calls sent to the others (`calls`), and tensor parallelism."""
