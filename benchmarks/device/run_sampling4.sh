#!/usr/bin/env bash
# The sampling kernel with one block of logits per program and the noise key derived in the
# kernel: profile and block sweep, its GPU tests (kernel vs reference, fused vs unfused sampled
# tokens, seeded sampling across modes), SDAR-1.7B rounds greedy vs sampled in the same run.
set -uo pipefail
source benchmarks/device/common.sh
timeout 150 python3 benchmarks/device/sampling_profile.py >> $LOG 2>&1
grep "block=\|launches\|greedy\|Error" $LOG | tail -30
timeout 200 python3 -m pytest -q -x tests/kernels/test_sampling_kernel.py \
    tests/e2e/test_fused_tokens.py -k "sampl" tests/e2e/test_execution_modes.py >> $LOG 2>&1
tail -1 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
step --model $M/SDAR-1.7B-Chat $O --temperature 0.8 --top-k 50 --top-p 0.9 --context 0 >/dev/null
step --model $M/SDAR-1.7B-Chat $O --temperature 1.0 --top-p 0.95 --context 0 >/dev/null
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
