"""Decoding: options and their resolution, the per-round quota, sampling, remasking strategies."""
