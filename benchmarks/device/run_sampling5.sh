#!/usr/bin/env bash
# Profile and block sweep of the sampling kernel alone (graph-replayed, reference in the same run).
set -uo pipefail
source benchmarks/device/common.sh
timeout 150 python3 benchmarks/device/sampling_profile.py >> $LOG 2>&1
grep "block=\|launches\|greedy\|Error" $LOG | tail -30
