"""Multi-process plumbing (torchrun): rank discovery, the control channel between ranks, rank
0's calls sent to the others (`calls`), tensor parallelism, and data parallelism (`data_parallel`,
`links`)."""
