"""`dlrt bench memory`: the memory an engine holds awake, after `sleep(1)` and after `sleep(2)`,
how long sleeping and waking take, and whether the tokens after each wake equal those before.

One request (a fixed prompt of token ids; the decoding flags, `--max-new-tokens` 32 unless
given; EOS ignored, so every block runs) captures the graphs; then per phase:

  awake     after that request (KV cache, programs, graphs and weights held)
  sleep(1)  after `sleep(1)`; then `wake_up()` and the request again
  sleep(2)  after `sleep(2)`; then `wake_up(model folder)` and the request again (not with
            `--load-format dummy`: there is no folder to wake with)

Columns, measured on rank 0 (under torchrun every rank sleeps, but only rank 0's process is
measured): on CUDA `allocated_bytes` / `reserved_bytes` (torch.cuda.memory_allocated /
memory_reserved: what torch's allocator hands out and keeps) and `device_used_bytes` (the
device's used memory, `cudaMemGetInfo`: other processes and the CUDA context included); on the
CPU `rss_bytes` (the process's resident set, Linux `/proc/self/statm`; None elsewhere: the
weights of a CPU engine stay in host memory at level 1). On both: `weights_bytes` (the storage
the parameters hold, wherever it is), `weights_on_device_bytes` (of it, on the engine's
device: 0 asleep on CUDA) and `kv_cache_bytes`. `sleep_s` / `wake_s`: the calls' wall time.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from dlrt.bench.report import table, write_json

COLUMNS = ["phase", "allocated_bytes", "reserved_bytes", "device_used_bytes", "rss_bytes",
           "weights_bytes", "weights_on_device_bytes", "kv_cache_bytes", "sleep_s", "wake_s",
           "tokens_equal"]
PROMPT = list(range(10, 42))  # token ids every tiny and real vocabulary holds


def rss_bytes() -> int | None:
    """The process's resident set in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def measure(llm) -> dict[str, Any]:
    """The memory columns of one phase (see the module docstring)."""
    device = llm.device
    params = list({id(p): p for p in llm.model.parameters()}.values())
    held = [p.untyped_storage().nbytes() for p in params]
    on_device = sum(n for p, n in zip(params, held, strict=True) if p.device == device)
    row = dict(weights_bytes=sum(held), weights_on_device_bytes=on_device,
               kv_cache_bytes=llm.kv_cache.nbytes, allocated_bytes=None, reserved_bytes=None,
               device_used_bytes=None, rss_bytes=None)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        row.update(allocated_bytes=torch.cuda.memory_allocated(device),
                   reserved_bytes=torch.cuda.memory_reserved(device),
                   device_used_bytes=total - free)
    else:
        row["rss_bytes"] = rss_bytes()
    return row


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def run(llm, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The three phases' rows (see the module docstring); the LLM ends awake (asleep with
    dummy weights)."""
    request = {"max_new_tokens": 32, **options, "ignore_eos": True}

    def tokens() -> list[int]:
        return llm.generate(PROMPT, **request).token_ids

    want = tokens()
    rows = [dict(phase="awake", **measure(llm))]
    slept = _timed(llm.sleep, 1)
    row = dict(phase="sleep(1)", sleep_s=slept, **measure(llm))
    row["wake_s"] = _timed(llm.wake_up)
    row["tokens_equal"] = tokens() == want
    rows.append(row)
    slept = _timed(llm.sleep, 2)
    row = dict(phase="sleep(2)", sleep_s=slept, **measure(llm))
    if llm.engine_config.load_format == "dummy":
        row.update(wake_s=None, tokens_equal=None)  # (no folder: it is closed asleep)
    else:
        row["wake_s"] = _timed(llm.wake_up, llm.folder.path)
        row["tokens_equal"] = tokens() == want
    rows.append(row)
    return rows


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
    """Run the phases, print the table, write the JSON record; 1 when the tokens after a wake
    differ from those before."""
    from dlrt import LLM

    llm = LLM(**llm_kwargs)
    rows = run(llm, options)
    print(table(rows, COLUMNS))
    model = llm.engine_config.model
    name = f"memory-{str(model).rstrip('/').split('/')[-1]}"
    path = write_json(name, dict(model=str(model), dtype=str(llm.dtype),
                                 execution_mode=llm.execution_mode,
                                 tensor_parallel_size=llm.engine_config.tensor_parallel_size,
                                 measured="rank 0", options=options, rows=rows),
                      llm.device, args.out)
    print(f"wrote {path}")
    llm.close()
    return 0 if all(r.get("tokens_equal") is not False for r in rows) else 1
