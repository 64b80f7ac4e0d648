#!/usr/bin/env bash
# L2 prefetch as per-line `prefetch.global.L2::evict_last` (run 1's bulk prefetch was slower):
# SDAR-1.7B and SDAR-8B rounds at context 0, prefetch off (0) and at several sizes (MiB), one
# process each, off first and last (drift); then the prefetch GPU tests and the fused-token
# tests. Step JSONs are packed into steps.tgz (the call returns a limited number of files).
# Ran at 2d6cc4d (the per-line kernel); the runtime prefetch and DLRT_L2_PREFETCH_MB were removed
# after these runs (slower at every size).
set -uo pipefail
source benchmarks/device/common.sh
run() { (export DLRT_L2_PREFETCH_MB=$1; shift; step "$@" >/dev/null); }
for mb in 0 4 8 16 0; do run $mb --model $M/SDAR-1.7B-Chat $O --context 0; done
echo "1.7B done at $(( $(date +%s) - t0 )) s"
for mb in 0 8 16 0; do run $mb --model $M/SDAR-8B-Chat $O --context 0; done
python3 benchmarks/device/summarize_step.py $OUT
echo "rounds done at $(( $(date +%s) - t0 )) s"
timeout 150 python3 -m pytest -q tests/kernels/test_l2_prefetch_gpu.py tests/e2e/test_fused_tokens.py \
  >> $LOG 2>&1
tail -3 $LOG
(cd $OUT && tar czf steps.tgz step-*.json && rm step-*.json)
echo "total $(( $(date +%s) - t0 )) s"
