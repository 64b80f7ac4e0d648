"""Request benchmark: generate on HumanEval prompts, report round latency, TPF and TPS."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from dlrt.bench.report import table, write_json

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "humaneval.jsonl"
COLUMNS = ["task", "prompt_tokens", "new_tokens", "blocks", "rounds", "round_ms", "tpf",
           "tps", "finish"]


def load_prompts(path: str | Path | None, count: int) -> list[dict[str, str]]:
    """The first `count` HumanEval problems ({task_id, prompt})."""
    path = Path(path) if path else DEFAULT_DATA
    if not path.is_file():
        raise FileNotFoundError(f"HumanEval data not found at {path}; pass --data")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:count]


def run(llm, problems: list[dict[str, str]], options: dict[str, Any], chat: bool,
        warmup: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generate for every problem; return per-request rows and a summary.

    round_ms: median wall time of one denoising forward (eager; synchronised per forward).
    tps: new tokens / request wall time. tpf: new tokens / rounds.
    """
    def prompt_of(p):
        return [{"role": "user", "content": p["prompt"]}] if chat else p["prompt"]

    for p in problems[:warmup]:
        llm.generate(prompt_of(p), **options)
    rows = []
    for p in problems:
        llm.runner.timings = []
        t0 = time.perf_counter()
        r = llm.generate(prompt_of(p), **options)
        wall = time.perf_counter() - t0
        rounds_s = [s for kind, s in llm.runner.timings if kind == "round"]
        llm.runner.timings = None
        rows.append(dict(
            task=p["task_id"], prompt_tokens=len(r.prompt_token_ids),
            new_tokens=len(r.token_ids), blocks=len(r.denoise_steps),
            rounds=sum(r.denoise_steps),
            round_ms=1e3 * statistics.median(rounds_s) if rounds_s else 0.0,
            tpf=r.timings["tpf"], tps=len(r.token_ids) / wall, finish=r.finish_reason))
    tokens = sum(r["new_tokens"] for r in rows)
    summary = dict(
        requests=len(rows), new_tokens=tokens,
        mean_tps=statistics.mean(r["tps"] for r in rows),
        median_round_ms=statistics.median(r["round_ms"] for r in rows),
        mean_tpf=statistics.mean(r["tpf"] for r in rows),
        rounds_per_block=sum(r["rounds"] for r in rows) / max(sum(r["blocks"] for r in rows), 1),
    )
    return rows, summary


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
    from dlrt import LLM

    llm = LLM(args.model, **llm_kwargs)
    problems = load_prompts(args.data, args.num_prompts)
    chat = args.chat and llm.tokenizer is not None
    if llm.tokenizer is None:  # LLaDA-shaped checkpoints without a tokenizer: fixed token ids
        problems = [dict(p, prompt=list(range(1000, 1000 + 16 + 8 * i)))
                    for i, p in enumerate(problems)]
    rows, summary = run(llm, problems, options, chat)
    print(table(rows, COLUMNS))
    print(table([summary], list(summary)))
    name = f"humaneval-{Path(str(args.model or 'default')).name}"
    path = write_json(name, dict(model=str(args.model), decoder=llm.decoder_name,
                                 dtype=str(llm.dtype), options=options, rows=rows,
                                 summary=summary), llm.device, args.out)
    print(f"wrote {path}")
    return 0
