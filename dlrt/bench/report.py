"""Benchmark reports: a printed table and a JSON record with commit, device and command."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

# NOTE: every benchmark's default output folder, ignored by git; the records the docs cite are
# copied by hand into the curated results folder beside it, which no benchmark writes to
BENCH_OUT = "benchmarks/runs"


def git_commit() -> str:
    """HEAD of the checkout dlrt runs from, with '-dirty' when files differ from it; a copy
    without .git (a device machine) takes DLRT_COMMIT from the environment."""
    from dlrt import env

    if env.commit():
        return env.commit()
    root = Path(__file__).resolve().parent  # git finds the checkout above it, if any
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(device: torch.device) -> str:
    """The GPU's name ("NVIDIA H100 80GB HBM3"), or "cpu (<processor>, <n> threads)" with
    torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def same_device(a: str, b: str) -> bool:
    """Whether two `device_name`s name the same device, the CPU's thread count aside (with
    `cpu_threads=auto` it follows the machine's load)."""
    def bare(name: str) -> str:
        return re.sub(r", \d+ threads\)$", ")", name) if name.startswith("cpu (") else name

    return bare(a) == bare(b)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Plain-text table of `columns` (floats with 3 significant decimals, None as "-": not
    measured)."""
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else "-" if v is None else str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def write_json(name: str, payload: dict[str, Any], device: torch.device,
               out_dir: str | Path = BENCH_OUT) -> Path:
    """Write `payload` plus commit, device, command and time to out_dir/name-<time>.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record = {"commit": git_commit(), "device": device_name(device),
              "command": " ".join(sys.argv), "time": stamp, "torch": torch.__version__,
              "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("DLRT_")},
              **payload}
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    return path
