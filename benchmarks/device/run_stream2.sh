#!/usr/bin/env bash
# The persistent layer kernel (tensor-core dots): its GPU tests (one launch vs staged, graph replays, greedy
# tokens eager and in the block graph), then the sweep of its configs against the classic
# and fused-GEMV second half of a layer on SDAR-1.7B and SDAR-8B shapes.
set -uo pipefail
source benchmarks/device/common.sh
timeout 240 python3 -m pytest -q tests/kernels/test_layer_stream.py \
    tests/e2e/test_fused_tokens.py -k "stream or greedy" >> $LOG 2>&1
tail -4 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
timeout 400 python3 benchmarks/device/layer_stream_sweep.py >> $LOG 2>&1
grep "floor\|classic\|GEMVs\|best\|Error\|error" $LOG | tail -20
echo "--- fastest streams"
grep " stream " $LOG | sort -k1,1 -k8,8n | awk '{c[$1]++; if (c[$1] <= 4) print}'
echo "total $(( $(date +%s) - t0 )) s"
