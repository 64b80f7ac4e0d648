#!/usr/bin/env bash
# Projection choice timed with weights streamed from HBM: GPU tests, bench step on SDAR-8B and
# SDAR-1.7B with the per-shape choice and with cuBLAS only (same run), kernel micro-benchmarks.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
step --model $M/SDAR-8B-Chat $O --context 0,4096,32640
DLRT_SKINNY_GEMM=0 step --model $M/SDAR-8B-Chat $O --context 0
step --model $M/SDAR-1.7B-Chat $O --context 0
DLRT_SKINNY_GEMM=0 step --model $M/SDAR-1.7B-Chat $O --context 0
python3 -m dlrt bench kernels --model $M/SDAR-8B-Chat --load-format dummy --out $OUT >> $LOG 2>&1
grep -A24 "^ *op " $LOG | tail -20
echo "total $(( $(date +%s) - t0 )) s"
