#!/usr/bin/env bash
# No context split when the query tiles cover the SMs: attention GPU tests, LLaDA canvas 256.
set -uo pipefail
source benchmarks/device/common.sh
timeout 100 python3 -m pytest -q -x tests/kernels/test_paged_attention.py tests/unit/test_triton_backend.py >> $LOG 2>&1; tail -1 $LOG
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
