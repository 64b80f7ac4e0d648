"""Benchmarks behind `dlrt bench ...` and the scripts in benchmarks/."""
