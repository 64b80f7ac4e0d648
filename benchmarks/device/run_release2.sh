#!/usr/bin/env bash
# Projections all on the Triton GEMMs (DLRT_SKINNY_GEMM=all: no cuBLAS kernel breaks the PDL
# chain) against the per-shape choice, each with the GEMMs releasing their dependent after
# (end) or before (start) their main loop; two passes in alternating order, context 0.
# Ran at 21daa80 (run 2); DLRT_GEMM_RELEASE was removed after it, so at later commits the
# end and start runs are the same code.
set -uo pipefail
source benchmarks/device/common.sh
for pass in 1 2; do
  for g in 1 all; do
    for r in end start; do
      DLRT_SKINNY_GEMM=$g DLRT_GEMM_RELEASE=$r step --model $M/SDAR-8B-Chat $O --context 0 >/dev/null
      DLRT_SKINNY_GEMM=$g DLRT_GEMM_RELEASE=$r step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
    done
  done
  echo "pass $pass done at $(( $(date +%s) - t0 )) s"
done
python3 benchmarks/device/summarize_step.py $OUT | sort -k1,1 -k4,4
(cd $OUT && tar czf steps.tgz step-*.json && rm step-*.json)
echo "total $(( $(date +%s) - t0 )) s"
