#!/usr/bin/env bash
# The persistent round kernel on the GPU: its GPU tests, then `dlrt bench step` with the layer
# path and with `--round-kernel persistent` alternating, per model and context (one process per
# run; the persistent runs add the per-SM timeline), then one table (summarize.py; ratio to the
# layers' runs).
# Usage: bash benchmarks/device/persistent_round.sh [--no-tests] [--context LIST]
#          [--tags "TAG..."] MODEL...
#   MODEL: a folder under .devtools/models (SDAR-1.7B-Chat, SDAR-8B-Chat); --context default 0
#   TAG: layers or persistent, with -pfN (DLRT_PERSISTENT_PREFETCH=N), -pagesM
#   (DLRT_PERSISTENT_PAGES=M) and/or -fp8 (weight-only FP8 projections, quantised while
#   loading), e.g. persistent-pages4-pf0, layers-fp8; run in the order given;
#   default "layers persistent persistent-pf65536 layers persistent" (the prefetch is off
#   unless a tag or DLRT_PERSISTENT_PREFETCH sets it)
# Carry: .devtools. Records: $OUT/step/TAG; tests $OUT/tests.txt.
set -uo pipefail
source benchmarks/device/common.sh
tests=1 context=0 models=() tags="layers persistent persistent-pf65536 layers persistent"
while [ $# -gt 0 ]; do
  case $1 in
    --no-tests) tests=0; shift ;;
    --context) context=$2; shift 2 ;;
    --tags) tags=$2; shift 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || { sed -n 5,13p "$0"; exit 2; }
if [ $tests = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu tests/kernels/test_persistent_round.py \
    tests/e2e/test_persistent_round_gpu.py -p no:cacheprovider -rf -s > "$OUT/tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|error)|differing" "$OUT/tests.txt" | tail -12
  elapsed "tests"
fi
for model in "${models[@]}"; do
  for tag in $tags; do
    kind=${tag%%-*}
    pf=$(echo "$tag" | sed -n 's/.*-pf\([0-9]*\).*/\1/p')
    pages=$(echo "$tag" | sed -n 's/.*-pages\([0-9]*\).*/\1/p')
    quant=()
    case $tag in *-fp8*) quant=(--quantization fp8 --fp8-activations weight_only) ;; esac
    echo "== $tag $model $context" >> "$LOG"
    DLRT_PERSISTENT_PREFETCH=${pf:-${DLRT_PERSISTENT_PREFETCH:-0}} \
    DLRT_PERSISTENT_PAGES=${pages:-${DLRT_PERSISTENT_PAGES:-0}} \
      timeout 200 python3 -m dlrt bench step --model "$M/$model" \
      --load-format dummy --context "$context" --rounds 100 --temperature 0 \
      --remasking-strategy low_confidence_static --round-kernel $kind "${quant[@]}" \
      --out "$OUT/step/$tag" >> "$LOG" 2>&1 || echo "$tag $model failed"
    elapsed "$tag $model"
  done
done
grep -A3 "timeline_span_us" "$LOG" | tail -8
python3 benchmarks/device/summarize.py "$OUT/step"
