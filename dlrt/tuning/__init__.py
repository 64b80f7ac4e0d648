"""Load-time choices from timings on the device: each returns a plan and writes no globals."""
