#!/usr/bin/env bash
# The GEMV projection kernel under PDL: GPU tests, then bench step at empty context on SDAR-1.7B
# and SDAR-8B with the per-shape choice (cuBLAS / dot / GEMV), cuBLAS only, and cuBLAS only
# without PDL (the previous default), all in the same run. Summary table last.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
for model in SDAR-1.7B-Chat SDAR-8B-Chat; do
  for v in "DLRT_PDL=1" "DLRT_SKINNY_GEMM=0" "DLRT_PDL=0 DLRT_SKINNY_GEMM=0"; do
    echo "== $model $v" >> $LOG; (export $v; step --model $M/$model $O --context 0 >/dev/null)
  done
done
grep "^projection\|^==\|Error\|error" $LOG | tail -30
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
