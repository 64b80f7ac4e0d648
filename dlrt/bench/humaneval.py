"""Request benchmark: generate on HumanEval prompts, report round latency, TPF and TPS.

With data parallelism (`--data-parallel-size`) the prompts are shared among the groups as
`LLM.generate` shares a list (`LLM.share`); each group times its own share, and the report
gives each group's throughput (its new tokens over its requests' wall time) and the total (all
new tokens over the longest group's wall time: the groups run side by side)."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dlrt.bench.report import table, write_json
from dlrt.errors import OptionError
from dlrt.resources import data_path

DEFAULT_DATA = data_path("humaneval.jsonl")  # the 164 HumanEval problems (MIT, openai)
COLUMNS = ["task", "prompt_tokens", "new_tokens", "blocks", "rounds", "ms_per_round", "tpf",
           "tps", "finish"]
MODE_COLUMNS = ["mode", "mean_tps", "tps_vs_eager", "mean_ms_per_round", "mean_tpf",
                "rounds_per_block", "same_tokens_as_first"]
GROUP_COLUMNS = ["group", "requests", "new_tokens", "wall_s", "tps"]


def load_prompts(path: str | Path | None, count: int) -> list[dict[str, str]]:
    """The first `count` HumanEval problems ({task_id, prompt}).

    Raises:
        OptionError: the file is missing or unreadable, or a line is not a problem.
    """
    path = Path(path) if path else DEFAULT_DATA
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise OptionError(f"cannot read the HumanEval data {path} (pass --data): {e}") from e
    rows = []
    for number, line in enumerate(lines, 1):
        if len(rows) == count:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("task_id"), str) \
                or not isinstance(row.get("prompt"), str):
            raise OptionError(f"{path} line {number} is not a HumanEval problem (a JSON object "
                              "with string task_id and prompt)")
        rows.append(row)
    if not rows:
        raise OptionError(f"{path} holds no HumanEval problems")
    return rows


def for_model(llm, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`problems` as they are, or, for a checkpoint without a tokenizer (LLaDA-shaped), as many
    requests of fixed token ids (task ids-N, prompt a list of ids)."""
    if llm.tokenizer is not None:
        return problems
    print("note: the checkpoint has no tokenizer: each request is fixed token ids "
          "(rows ids-N), not a HumanEval prompt")
    return [dict(task_id=f"ids-{i}", prompt=list(range(1000, 1000 + 16 + 8 * i)))
            for i in range(len(problems))]


def check_writable(folder: str | Path) -> None:
    """Make `folder` and check a file can be written in it (before a long run).

    Raises:
        OptionError: it cannot.
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise OptionError(f"cannot write results into {folder} (--out): {e}") from e


def run(llm, problems: list[dict[str, str]], options: dict[str, Any], chat: bool,
        warmup: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generate for every problem; return per-request rows and a summary.

    ms_per_round: request wall time / denoising rounds (prefill and cache writes included).
    tps: new tokens / request wall time. tpf: new tokens / rounds.
    """
    def prompt_of(p):
        return [{"role": "user", "content": p["prompt"]}] if chat else p["prompt"]

    for p in problems[:warmup]:
        llm.generate(prompt_of(p), **options)
    rows, walls = [], []
    for p in problems:
        if llm.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = llm.generate(prompt_of(p), **options)
        wall = time.perf_counter() - t0
        walls.append(wall)
        rounds = sum(r.denoise_steps)
        rows.append(dict(
            task=p["task_id"], prompt_tokens=len(r.prompt_token_ids),
            new_tokens=len(r.token_ids), blocks=len(r.denoise_steps), rounds=rounds,
            ms_per_round=1e3 * wall / max(rounds, 1), tpf=r.timings["tpf"],
            tps=len(r.token_ids) / wall, finish=r.finish_reason, token_ids=r.token_ids))
    return rows, summarize(rows, sum(walls))


def summarize(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The summary of `run`'s rows (`wall_s`: the seconds they took)."""
    return dict(
        requests=len(rows), new_tokens=sum(r["new_tokens"] for r in rows),
        mean_tps=statistics.mean(r["tps"] for r in rows),
        mean_ms_per_round=statistics.mean(r["ms_per_round"] for r in rows),
        mean_tpf=statistics.mean(r["tpf"] for r in rows),
        rounds_per_block=sum(r["rounds"] for r in rows) / max(sum(r["blocks"] for r in rows), 1),
        wall_s=wall_s,
    )


def run_share(llm, problems: list[dict[str, str]], options: dict[str, Any], chat: bool
              ) -> tuple[list[int], list[dict[str, Any]], float]:
    """On every rank (`collective_rpc`): `run` on this rank's data-parallel group's share of
    `problems` (`LLM.share`): (the problems' indices, their rows, the requests' wall
    seconds)."""
    prompts = [[{"role": "user", "content": p["prompt"]}] if chat else p["prompt"]
               for p in problems]
    mine = llm.share(prompts, **options)[llm.data_parallel_rank]
    if not mine:
        return [], [], 0.0
    rows, summary = run(llm, [problems[i] for i in mine], options, chat)
    return mine, rows, summary["wall_s"]


def shared_run(llm, problems: list[dict[str, str]], options: dict[str, Any], chat: bool
               ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The problems shared among the data-parallel groups: (every problem's row in problem
    order, their summary as `run` gives it, {"groups": a row per group (GROUP_COLUMNS and its
    tasks), "total": requests, new_tokens, wall_s (the longest group's), tps})."""
    values = llm.collective_rpc(run_share, problems, options, chat)
    per = len(values) // llm.data_parallel_size
    leaders = values[::per]  # each group's first rank (every rank of a group runs its share)
    rows: dict[int, dict[str, Any]] = {}
    groups = []
    for g, (mine, group_rows, wall) in enumerate(leaders):
        rows.update(zip(mine, group_rows, strict=True))
        tokens = sum(r["new_tokens"] for r in group_rows)
        groups.append(dict(group=g, requests=len(mine), new_tokens=tokens, wall_s=wall,
                           tps=tokens / wall if wall else 0.0,
                           tasks=[r["task"] for r in group_rows]))
    ordered = [rows[i] for i in range(len(problems))]
    tokens, wall = sum(r["new_tokens"] for r in ordered), max(g["wall_s"] for g in groups)
    total = dict(requests=len(ordered), new_tokens=tokens, wall_s=wall,
                 tps=tokens / wall if wall else 0.0)
    return ordered, summarize(ordered, wall), dict(groups=groups, total=total)


def compare_modes(modes: list[str], results: dict[str, dict]) -> list[dict[str, Any]]:
    """One row per mode (MODE_COLUMNS) from one rank's {mode: {rows, summary}}."""
    first = results[modes[0]]["rows"]
    eager_tps = results["eager"]["summary"]["mean_tps"] if "eager" in results else None
    compare = []
    for mode in modes:
        s = results[mode]["summary"]
        compare.append(dict(
            mode=mode, mean_tps=s["mean_tps"],
            tps_vs_eager=s["mean_tps"] / eager_tps if eager_tps else float("nan"),
            mean_ms_per_round=s["mean_ms_per_round"], mean_tpf=s["mean_tpf"],
            rounds_per_block=s["rounds_per_block"],
            same_tokens_as_first=all(a["token_ids"] == b["token_ids"]
                                     for a, b in zip(first, results[mode]["rows"], strict=True))))
    return compare


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
    from dlrt import LLM

    problems = load_prompts(args.data, args.num_prompts)
    check_writable(args.out)
    llm = LLM(**llm_kwargs)
    chat = args.chat and llm.tokenizer is not None
    problems = for_model(llm, problems)
    modes = args.modes.split(",") if args.modes else [llm.execution_mode]
    runs = {}  # mode -> every rank's (rows, summary): under torchrun each rank times its own
    shared = {}  # mode -> each data-parallel group's throughput and the total
    for mode in modes:
        llm.set_execution_mode(mode)
        if llm.data_parallel_size == 1:
            runs[mode] = llm.collective_rpc(run, problems, options, chat)
        else:  # one row per problem, from the group that ran it
            rows, summary, shared[mode] = shared_run(llm, problems, options, chat)
            runs[mode] = [(rows, summary)]
        print(f"[{mode}]")
        print(table(runs[mode][0][0], COLUMNS))
        if mode in shared:
            print(table(shared[mode]["groups"], GROUP_COLUMNS))
            print(table([dict(group="total", **shared[mode]["total"])], GROUP_COLUMNS))
    world = len(runs[modes[0]])
    results = [{m: dict(rows=runs[m][r][0], summary=runs[m][r][1]) for m in modes}
               for r in range(world)]
    compare = [compare_modes(modes, results[r]) for r in range(world)]
    print(table(compare[0], MODE_COLUMNS))
    if world > 1:  # tensor parallelism: each rank's own timing of the same requests
        print(table([dict(rank=r, **c) for r in range(world) for c in compare[r]],
                    ["rank", *MODE_COLUMNS]))
    model = llm.engine_config.model
    name = f"humaneval-{Path(str(model or 'default')).name}"
    path = write_json(name, dict(model=str(model), decoder=llm.decoder_name,
                                 dtype=str(llm.dtype), attention=llm.attention_backend,
                                 tensor_parallel_size=llm.engine_config.tensor_parallel_size,
                                 data_parallel_size=llm.data_parallel_size,
                                 **({"data_parallel": shared} if shared else {}),
                                 options=options, modes=results[0], compare=compare[0],
                                 **({} if world == 1 else dict(world=world,
                                                               per_rank_compare=compare))),
                      llm.device, args.out)
    print(f"wrote {path}")
    return 0
