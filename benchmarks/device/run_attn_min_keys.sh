#!/usr/bin/env bash
# Fewest keys per context split of the Triton attention (DLRT_ATTENTION_MIN_KEYS): SDAR-8B at
# contexts 0, 4k and 16k in one process (cache to 32k: 64 splits), default first and last;
# then the attention GPU tests with 256.
# Ran at a9bbcfc; DLRT_ATTENTION_MIN_KEYS was removed after this run (longer splits were
# slower), so at later commits every setting runs the shipped one-tile splits.
set -uo pipefail
source benchmarks/device/common.sh
for k in 1 256 1024 1; do
  DLRT_ATTENTION_MIN_KEYS=$k step --model $M/SDAR-8B-Chat $O --max-model-len 32768 \
      --context 0,4096,16384 >/dev/null
  echo "min_keys $k done at $(( $(date +%s) - t0 )) s"
done
python3 benchmarks/device/summarize_step.py $OUT
DLRT_ATTENTION_MIN_KEYS=256 timeout 100 python3 -m pytest -q tests/kernels/test_paged_attention.py \
    tests/unit/test_triton_backend.py >> $LOG 2>&1
tail -1 $LOG
(cd $OUT && tar czf steps.tgz step-*.json && rm step-*.json)
echo "total $(( $(date +%s) - t0 )) s"
