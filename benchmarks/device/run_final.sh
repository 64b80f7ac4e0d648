#!/usr/bin/env bash
# Final check of the GPU tests on the last commit, plus a long prompt through the chunked
# prefill on the SDAR-1.7B config (device loop).
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
python3 - >> $LOG 2>&1 <<'PY'
import time, torch
from dlrt import LLM
llm = LLM(".devtools/models/SDAR-1.7B-Chat", load_format="dummy", max_model_len=20000)
t = time.time()
r = llm.generate(list(range(1000, 17000)), max_new_tokens=16, temperature=0)
print("long prompt 16000 tokens:", len(r.token_ids), r.finish_reason,
      f"{time.time() - t:.2f} s", f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
PY
tail -1 $LOG
echo "total $(( $(date +%s) - t0 )) s"
