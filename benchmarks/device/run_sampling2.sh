#!/usr/bin/env bash
# The fused sampling kernel after moving its row sums to fixed-point atomics and its [probe,
# logit] sums to one reduction per program: per-kernel profile and block sweep, GPU tests,
# SDAR-1.7B rounds greedy vs sampled (same run), bench kernels draws, the corrected FlashInfer
# re-planning test.
set -uo pipefail
source benchmarks/device/common.sh
timeout 120 python3 benchmarks/device/sampling_profile.py >> $LOG 2>&1
grep "block=\|  " $LOG | grep -v "^ *$" | tail -40
timeout 200 python3 -m pytest -q -x tests/kernels/test_sampling_kernel.py \
    tests/e2e/test_fused_tokens.py -k "sampl" tests/e2e/test_execution_modes.py >> $LOG 2>&1
tail -1 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
step --model $M/SDAR-1.7B-Chat $O --temperature 0.8 --top-k 50 --top-p 0.9 --context 0 >/dev/null
timeout 150 python3 -m dlrt bench kernels --model $M/SDAR-1.7B-Chat --load-format dummy \
    --out $OUT >> $LOG 2>&1
grep -A14 "^ *op " $LOG | grep -v projection | tail -14
left=$(( 560 - ($(date +%s) - t0) ))
echo "flashinfer re-planning test with ${left} s left"
timeout $left python3 -m pytest -q -x tests/e2e/test_flashinfer.py -k "seeded_sampling" >> $LOG 2>&1
tail -1 $LOG
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
