#!/usr/bin/env bash
# Layout sweep of the sampling kernel (block size x programs per row).
set -uo pipefail
source benchmarks/device/common.sh
timeout 150 python3 benchmarks/device/sampling_sweep.py >> $LOG 2>&1
grep "block=\|Error" $LOG | tail -40
