#!/usr/bin/env bash
# The fused sampling kernel: its GPU tests (kernel vs reference, fused vs unfused sampled
# tokens, seeded sampling across execution modes), SDAR-1.7B rounds greedy and sampled
# (temperature 0.8, top-k 50, top-p 0.9) in the same run, the draw micro-benchmarks of
# `bench kernels` (kernel vs PyTorch reference vs torch.compile), then the FlashInfer GPU tests.
set -uo pipefail
source benchmarks/device/common.sh
timeout 200 python3 -m pytest -q -x tests/kernels/test_sampling_kernel.py \
    tests/e2e/test_fused_tokens.py tests/e2e/test_execution_modes.py >> $LOG 2>&1
tail -2 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
step --model $M/SDAR-1.7B-Chat $O --temperature 0.8 --top-k 50 --top-p 0.9 --context 0 >/dev/null
timeout 150 python3 -m dlrt bench kernels --model $M/SDAR-1.7B-Chat --load-format dummy \
    --out $OUT >> $LOG 2>&1
grep -B2 -A14 "^ *op " $LOG | grep -v projection | tail -16
left=$(( 560 - ($(date +%s) - t0) ))
echo "flashinfer tests with ${left} s left"
timeout $left python3 -m pytest -q -x tests/e2e/test_flashinfer.py >> $LOG 2>&1
tail -2 $LOG
grep "Error\|error:" $LOG | tail -8
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
