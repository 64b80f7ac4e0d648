#!/usr/bin/env bash
# The FlashInfer attention backend: its GPU tests (kernels vs SDPA, mode identity; FlashInfer
# JIT-compiles FA2 and FA3 on first use), then bench step with triton / flashinfer /
# flashinfer-fa2 attention in the same run (SDAR-1.7B, SDAR-8B, LLaDA-8B canvas), then
# HumanEval request TPS with flashinfer (blocks not launched ahead).
set -uo pipefail
source benchmarks/device/common.sh
timeout 330 python3 -m pytest -q -x tests/e2e/test_flashinfer.py >> $LOG 2>&1
tail -3 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
for a in triton flashinfer flashinfer-fa2; do
  step --model $M/SDAR-1.7B-Chat $O --attention-backend $a --context 0,4096,16384 >/dev/null
done
for a in triton flashinfer; do
  step --model $M/SDAR-8B-Chat $O --attention-backend $a --context 0,32640 >/dev/null
  step --model $M/LLaDA-8B-Instruct $O --attention-backend $a --block-length 32 --context 256 >/dev/null
done
echo "steps done at $(( $(date +%s) - t0 )) s"
grep "Error\|error:" $LOG | tail -8
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
