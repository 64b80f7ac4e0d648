"""Checkpoint folders: reading (`folder`), loading weights (`loader`), writing (`make`)."""
