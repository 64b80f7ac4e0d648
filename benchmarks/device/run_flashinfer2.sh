#!/usr/bin/env bash
# After the default-backend choice: the GPU tests (kernels, execution modes, fused tokens,
# FlashInfer), then LLaDA-8B canvas rounds with the default backend (flashinfer on Hopper) and
# with triton in the same run, at 256- and 1024-token canvases.
set -uo pipefail
source benchmarks/device/common.sh
timeout 330 python3 -m pytest -q -x tests/kernels tests/unit/test_triton_backend.py \
    tests/e2e/test_fused_tokens.py tests/e2e/test_execution_modes.py \
    tests/e2e/test_flashinfer.py >> $LOG 2>&1
tail -3 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256,1024 >/dev/null
step --model $M/LLaDA-8B-Instruct $O --attention-backend triton --block-length 32 --context 256,1024 >/dev/null
grep "Error\|error:" $LOG | tail -8
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
