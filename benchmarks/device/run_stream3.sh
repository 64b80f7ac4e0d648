#!/usr/bin/env bash
# The persistent layer kernel with its weight tiles prefetched in registers (tensor-core
# dots): its kernel GPU tests, then the config sweep against the classic and fused-GEMV
# second half of a layer on SDAR-1.7B and SDAR-8B shapes.
set -uo pipefail
source benchmarks/device/common.sh
timeout 120 python3 -m pytest -q tests/kernels/test_layer_stream.py >> $LOG 2>&1
tail -2 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
timeout 400 python3 benchmarks/device/layer_stream_sweep.py >> $LOG 2>&1
grep "bandwidth\|floor \|classic\|GEMVs\|best\|Error\|error" $LOG | tail -20
echo "--- fastest streams"
grep " stream " $LOG | sort -k1,1 -k8,8n | awk '{c[$1]++; if (c[$1] <= 6) print}'
echo "total $(( $(date +%s) - t0 )) s"
