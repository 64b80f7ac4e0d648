#!/usr/bin/env bash
# Where the fused draw's time goes: per-kernel profile and block/warps sweep of the sampling
# kernel, then bench kernels' draw rows (kernel vs reference vs torch.compile) on SDAR-1.7B.
set -uo pipefail
source benchmarks/device/common.sh
timeout 150 python3 benchmarks/device/sampling_profile.py >> $LOG 2>&1
grep "block=\|launches\|greedy\|Error" $LOG | tail -40
timeout 200 python3 -m dlrt bench kernels --model $M/SDAR-1.7B-Chat --load-format dummy \
    --out $OUT >> $LOG 2>&1
grep -A14 "^ *op " $LOG | grep -v projection | tail -14
echo "total $(( $(date +%s) - t0 )) s"
