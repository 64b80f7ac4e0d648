#!/usr/bin/env python3
"""Write a Hugging Face checkpoint with seeded random weights (same as `dlrt make-checkpoint`).

    python tools/make_checkpoint.py ../shared/models/SDAR-4B-Chat /tmp/sdar4b --num-layers 2
"""

import sys

from dlrt.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main(["make-checkpoint", *sys.argv[1:]]))
