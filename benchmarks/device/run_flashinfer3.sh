#!/usr/bin/env bash
# After the review fixes: the FlashInfer GPU tests (kernels vs SDPA, mode identity, tokens vs
# triton across context lengths), then LLaDA-8B canvas rounds (256-token canvas) with the
# default backend and with triton, and SDAR-1.7B rounds with sampling (temperature, top-k,
# top-p) vs greedy, all in the same run.
set -uo pipefail
source benchmarks/device/common.sh
timeout 300 python3 -m pytest -q -x tests/e2e/test_flashinfer.py >> $LOG 2>&1
tail -3 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
step --model $M/LLaDA-8B-Instruct $O --attention-backend triton --block-length 32 --context 256 >/dev/null
step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
step --model $M/SDAR-1.7B-Chat $O --temperature 0.8 --top-k 50 --top-p 0.9 --context 0 >/dev/null
grep "Error\|error:" $LOG | tail -8
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
