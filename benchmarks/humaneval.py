#!/usr/bin/env python3
"""Generate on HumanEval prompts; print round latency, TPF and TPS; write benchmarks/runs/.

    python benchmarks/humaneval.py --model CKPT --num-prompts 8 --max-new-tokens 128 --chat
Same as `dlrt bench humaneval ...`.
"""

import sys

from dlrt.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "humaneval", *sys.argv[1:]]))
