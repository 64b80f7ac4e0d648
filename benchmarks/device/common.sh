# Sourced by the device scripts: device environment, the checkout on PYTHONPATH, a log file.
source .devtools/device-env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} DLRT_CACHE_DIR=/tmp/dlrt-cache
M=.devtools/models
LOG=$OUT/run.log
t0=$(date +%s)

# The GPU tests that matter for kernels and execution modes (the rest assume CPU numerics).
gpu_tests() {
  timeout 200 python3 -m pytest -q -x tests/kernels tests/unit/test_triton_backend.py \
      tests/e2e/test_fused_tokens.py tests/e2e/test_execution_modes.py >> $LOG 2>&1
  tail -2 $LOG
  echo "tests done at $(( $(date +%s) - t0 )) s"
}

# Shared benchmark steps: the options of the step/humaneval runs and their printed tails.
O="--load-format dummy --temperature 0 --remasking-strategy low_confidence_static"
H="--temperature 0 --remasking-strategy low_confidence_static --block-length 4 --denoising-steps 4 --ignore-eos --chat --max-new-tokens 128"
step() {
  timeout 180 python3 -m dlrt bench step --out $OUT --rounds 50 "$@" >> $LOG 2>&1
  tail -18 $LOG | grep -v "^wrote\|Warn\|capture_end"
}
he() {
  timeout 150 python3 -m dlrt bench humaneval --out $OUT "$@" >> $LOG 2>&1
  tail -5 $LOG | grep -v "^wrote"
}
