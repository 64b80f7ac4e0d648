#!/usr/bin/env bash
# Programmatic dependent launch: GPU tests with PDL on, then bench step on SDAR-1.7B and SDAR-8B
# with PDL off / on, per-shape GEMM choice / every projection on the Triton GEMM, and the
# GEMM's L2 prefetch budget (same run). Summary table last.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
for v in "DLRT_PDL=0" "DLRT_PDL=1" "DLRT_PDL=1 DLRT_SKINNY_GEMM=all" \
         "DLRT_PDL=1 DLRT_SKINNY_GEMM=all DLRT_GEMM_PREFETCH_MB=0" \
         "DLRT_PDL=1 DLRT_SKINNY_GEMM=all DLRT_GEMM_PREFETCH_MB=48"; do
  echo "== 1.7B $v" >> $LOG; (export $v; step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null)
done
for v in "DLRT_PDL=0" "DLRT_PDL=1" "DLRT_PDL=1 DLRT_SKINNY_GEMM=all"; do
  echo "== 8B $v" >> $LOG; (export $v; step --model $M/SDAR-8B-Chat $O --context 0 >/dev/null)
done
grep "^projection\|^==\|Error\|error" $LOG | tail -40
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
