#!/usr/bin/env bash
# The sampling kernel at the swept layout (512-logit blocks, 5 per program): profile vs the
# reference draw, GPU tests, rounds greedy vs sampled on SDAR-1.7B and SDAR-8B (same run),
# bench kernels draw rows (kernel vs reference vs torch.compile).
set -uo pipefail
source benchmarks/device/common.sh
timeout 100 python3 benchmarks/device/sampling_profile.py >> $LOG 2>&1
grep "block=\|launches\|greedy\|Error" $LOG | tail -14
timeout 200 python3 -m pytest -q -x tests/kernels/test_sampling_kernel.py \
    tests/e2e/test_fused_tokens.py -k "sampl" tests/e2e/test_execution_modes.py >> $LOG 2>&1
tail -1 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
for m in SDAR-1.7B-Chat SDAR-8B-Chat; do
  step --model $M/$m $O --context 0 >/dev/null
  step --model $M/$m $O --temperature 0.8 --top-k 50 --top-p 0.9 --context 0 >/dev/null
done
step --model $M/SDAR-1.7B-Chat $O --temperature 1.0 --top-p 0.95 --context 0 >/dev/null
timeout 120 python3 -m dlrt bench kernels --model $M/SDAR-1.7B-Chat --load-format dummy \
    --out $OUT >> $LOG 2>&1
grep -A12 "^ *op " $LOG | grep -v projection | tail -12
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
