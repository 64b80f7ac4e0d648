#!/usr/bin/env bash
# Where the skinny GEMMs release their PDL dependent: after the main loop (end, the default) or
# before it (start: the next kernels launch, load their first weight tiles and wait). Rounds at
# context 0, alternating end / start in separate processes; then the token-identity GPU tests
# with start.
# Ran at 3419603; DLRT_GEMM_RELEASE was removed after runs 1 and 2 (at most 0.25% a round),
# so at later commits both settings run the same code.
set -uo pipefail
source benchmarks/device/common.sh
for r in end start end start; do
  DLRT_GEMM_RELEASE=$r step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
done
echo "1.7B done at $(( $(date +%s) - t0 )) s"
for r in end start end start; do
  DLRT_GEMM_RELEASE=$r step --model $M/SDAR-8B-Chat $O --context 0 >/dev/null
done
python3 benchmarks/device/summarize_step.py $OUT
echo "rounds done at $(( $(date +%s) - t0 )) s"
DLRT_GEMM_RELEASE=start timeout 150 python3 -m pytest -q -x tests/e2e/test_fused_tokens.py \
    tests/e2e/test_execution_modes.py tests/kernels/test_fused_ops.py >> $LOG 2>&1
tail -2 $LOG
(cd $OUT && tar czf steps.tgz step-*.json && rm step-*.json)
echo "total $(( $(date +%s) - t0 )) s"
