#!/usr/bin/env bash
# Attention without the merge kernel (the last split merges; one split writes directly):
# kernel/backend/mode GPU tests, then rounds against the previous commit in the same run
# (.devtools/base holds its dlrt package): SDAR-1.7B and SDAR-8B at contexts 0 and 4096,
# and the LLaDA-8B canvas (256 rows, Triton attention, one split).
# NOTE: PYTHONSAFEPATH keeps `python -m` from putting the checkout ahead of .devtools/base on
# sys.path; the runs recorded on 2026-11-30 lacked it, so their "base" rows ran the checkout.
set -uo pipefail
source benchmarks/device/common.sh
timeout 220 python3 -m pytest -q tests/kernels tests/unit/test_triton_backend.py \
    tests/e2e/test_execution_modes.py tests/e2e/test_fused_tokens.py >> $LOG 2>&1
tail -3 $LOG | grep -v "^$"; echo "tests done at $(( $(date +%s) - t0 )) s"
for m in SDAR-1.7B-Chat SDAR-8B-Chat; do
  echo "== $m new" >> $LOG; step --model $M/$m $O --context 0,4096 >/dev/null
  echo "== $m base" >> $LOG
  (export PYTHONSAFEPATH=1 PYTHONPATH=$PWD/.devtools/base DLRT_COMMIT=a27a864; step --model $M/$m $O --context 0,4096 >/dev/null)
  echo "$m done at $(( $(date +%s) - t0 )) s"
done
step --model $M/LLaDA-8B-Instruct $O --attention-backend triton --block-length 32 \
    --context 256 >/dev/null
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
