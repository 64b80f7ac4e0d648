#!/usr/bin/env bash
# Eager path on the GPU (BF16): checkpoints of the real configs made by our tool, the CLI on a
# HumanEval prompt through the real tokenizer and chat template, and the HumanEval request
# benchmark (round latency, TPF, TPS) per model. Run from the repo root on the device with the
# real configs copied to .devtools/models (see benchmarks/README.md). Results go to $OUT.
set -euo pipefail
source .devtools/device-env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ckpt; mkdir -p $CK
M=.devtools/models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
t0=$(date +%s)
python3 -m dlrt make-checkpoint $M/SDAR-1.7B-Chat $CK/sdar-1.7b --device cuda
python3 -m dlrt make-checkpoint $M/SDAR-4B-Chat $CK/sdar-4b --device cuda
echo "checkpoints written in $(( $(date +%s) - t0 )) s"; du -sh $CK/*
PROMPT=$(python3 -c 'import json; print(json.loads(open("benchmarks/data/humaneval.jsonl").readline())["prompt"])')
python3 -m dlrt generate --model $CK/sdar-4b --chat --prompt "$PROMPT" --max-new-tokens 32 \
    --temperature 0 --json > $OUT/generate-sdar4b.json
python3 -c "import json; r=json.load(open('$OUT/generate-sdar4b.json')); print('sdar-4b generate:', len(r['prompt_token_ids']), 'prompt tokens ->', r['token_ids'][:8], r['finish_reason'], 'tps %.1f' % r['request_tps'])"
common="--num-prompts 4 --max-new-tokens 64 --temperature 0 --out $OUT"
python3 -m dlrt bench humaneval --model $CK/sdar-1.7b --chat $common --remasking-strategy sequential
python3 -m dlrt bench humaneval --model $M/SDAR-8B-Chat --load-format dummy --chat $common --remasking-strategy sequential
python3 -m dlrt bench humaneval --model $M/LLaDA-8B-Instruct --load-format dummy --max-model-len 4096 \
    --num-prompts 2 --max-new-tokens 128 --block-length 32 --denoising-steps 32 --temperature 0 --out $OUT
python3 -m dlrt bench humaneval --model $M/LLaDA-8B-Instruct --load-format dummy --decoder dllm_var --max-model-len 4096 \
    --num-prompts 2 --max-new-tokens 128 --block-length 32 --temperature 0 --out $OUT
echo "total $(( $(date +%s) - t0 )) s"
