"""`dlrt bench serve`: the HTTP server against `LLM.stream` in this process, one model, one run.

direct: `LLM.stream` per HumanEval prompt in this process.
http:   the same model behind `python -m dlrt serve` (a subprocess on a free port, started after
        the direct model is freed), each prompt a `POST /generate` read as NDJSON with httpx.
Per request: ttfb_ms = ms from the request start to the first BlockOutput (direct) or first
NDJSON line (http, client side); tps = new tokens / request wall seconds (client side);
server_tps = the final NDJSON line's `request_tps` (the server's own count, HTTP excluded).
Each mode runs one warm-up request first. `same_tokens`: the HTTP token ids equal the direct
ones for every prompt; with greedy decoding a difference fails the run (exit code 1).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import dlrt
from dlrt.bench.humaneval import check_writable, for_model, load_prompts
from dlrt.bench.report import table, write_json
from dlrt.decoding.options import DecodingOptions
from dlrt.engine.config import ENGINE_FLAGS

COLUMNS = ["mode", "requests", "mean_ttfb_ms", "mean_tps", "mean_server_tps", "tokens",
           "same_tokens"]


def _body(prompt: Any, chat: bool) -> dict[str, Any]:
    """The /generate body of a HumanEval prompt (text, chat messages or token ids)."""
    if isinstance(prompt, list):
        return {"input_ids": prompt}
    return {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}


def _direct_one(llm, prompt: Any, chat: bool, options: dict[str, Any]) -> dict[str, Any]:
    if chat and isinstance(prompt, str):  # as /generate does with "messages"
        prompt = [{"role": "user", "content": prompt}]
    if llm.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    first, ids, finish = None, [], None
    for block in llm.stream(prompt, **options):
        first = first if first is not None else time.perf_counter() - t0
        ids += block.token_ids
        finish = block.finish_reason
    wall = time.perf_counter() - t0
    return dict(ttfb_ms=1e3 * first, tps=len(ids) / wall, finish=finish, token_ids=ids)


def _http_one(client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    first, ids, final = None, [], None
    with client.stream("POST", url + "/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"POST /generate: HTTP {r.status_code}: {r.read()!r}")
        for line in r.iter_lines():
            if not line:
                continue
            first = first if first is not None else time.perf_counter() - t0
            row = json.loads(line)
            if row["type"] == "block":
                ids += row["token_ids"]
            elif row["type"] == "final":
                final = row
            else:
                raise RuntimeError(f"server error: {row.get('message')}")
    wall = time.perf_counter() - t0
    if final is None:
        raise RuntimeError("the NDJSON stream ended without a final line")
    return dict(ttfb_ms=1e3 * first, tps=len(ids) / wall, server_tps=final["request_tps"],
                finish=final["finish_reason"], token_ids=ids)


def _timed(problems: list[dict[str, Any]], one) -> dict[str, Any]:
    """One warm-up request, then `one(prompt)` per problem: rows and a summary."""
    one(problems[0]["prompt"])
    rows = [dict(task=p["task_id"], **one(p["prompt"])) for p in problems]
    for r in rows:
        r["new_tokens"] = len(r["token_ids"])
    summary = dict(requests=len(rows), tokens=sum(r["new_tokens"] for r in rows),
                   mean_ttfb_ms=statistics.mean(r["ttfb_ms"] for r in rows),
                   mean_tps=statistics.mean(r["tps"] for r in rows))
    if "server_tps" in rows[0]:
        summary["mean_server_tps"] = statistics.mean(r["server_tps"] for r in rows)
    return dict(rows=rows, summary=summary)


def run_direct(llm, problems: list[dict[str, Any]], chat: bool,
               options: dict[str, Any]) -> dict[str, Any]:
    """Time every problem through `llm.stream` in this process."""
    return _timed(problems, lambda p: _direct_one(llm, p, chat, options))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flags(values: dict[str, Any], flags: dict[str, str] | None = None) -> list[str]:
    """Command-line flags of keyword options (None left out); `flags` names the flag of an
    option whose flag is not its name."""
    out: list[str] = []
    for name, value in values.items():
        flag = (flags or {}).get(name) or "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dlrt serve exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"dlrt serve not ready after {timeout_s} s:\n"
                       f"{log.read_text(errors='replace')[-4000:]}")


def _stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM (uvicorn shuts down cleanly), wait up to `timeout_s` seconds, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_http(argv: list[str], problems: list[dict[str, Any]], chat: bool, port: int,
             startup_timeout_s: float) -> dict[str, Any]:
    """Start `argv` (a `dlrt serve` on `port`), time every problem over HTTP, stop it."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = str(Path(dlrt.__file__).resolve().parent.parent)  # import root: the same dlrt
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with tempfile.NamedTemporaryFile(prefix="dlrt-bench-serve-", suffix=".log",
                                     delete=False) as f:
        log = Path(f.name)
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    try:
        _wait_ready(proc, url, log, startup_timeout_s)
        with httpx.Client(timeout=httpx.Timeout(None, connect=30), trust_env=False) as client:
            result = _timed(problems, lambda p: _http_one(client, url, _body(p, chat)))
    except Exception:
        print(f"server log: {log}", file=sys.stderr)
        raise
    except KeyboardInterrupt:  # nothing went wrong: no log to point at
        log.unlink(missing_ok=True)
        raise
    finally:
        _stop(proc)
    log.unlink(missing_ok=True)
    return result


def main(args, llm_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
    from dlrt import LLM

    problems = load_prompts(args.data, args.num_prompts)
    check_writable(args.out)
    options = {"seed": 0, **options}  # one seed on both sides: sampling compares too
    llm = LLM(**llm_kwargs)
    problems = for_model(llm, problems)
    chat = args.chat and llm.tokenizer is not None
    greedy = llm.resolve(DecodingOptions.from_kwargs(options)).sampling.temperature == 0
    info = dict(model=llm.engine_config.model, decoder=llm.decoder_name, dtype=str(llm.dtype),
                attention=llm.attention_backend, execution_mode=llm.execution_mode,
                options=options)
    device = llm.device
    direct = run_direct(llm, problems, chat, options)
    del llm
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    port = args.port or _free_port()
    argv = [sys.executable, "-m", "dlrt", "serve", "--port", str(port),
            *_flags(llm_kwargs, ENGINE_FLAGS), *_flags(options)]
    http = run_http(argv, problems, chat, port, args.startup_timeout)
    same = all(a["token_ids"] == b["token_ids"]
               for a, b in zip(direct["rows"], http["rows"], strict=True))
    compare = [dict(mode="direct", **direct["summary"]),
               dict(mode="http", **http["summary"], same_tokens=same)]
    print(table(compare, COLUMNS))
    name = f"serve-{Path(info['model']).name}"
    path = write_json(name, dict(**info, server_command=" ".join(argv), same_tokens=same,
                                 modes=dict(direct=direct, http=http), compare=compare),
                      device, args.out)
    print(f"wrote {path}")
    if greedy and not same:
        print("error: greedy tokens over HTTP differ from the direct ones", file=sys.stderr)
        return 1
    return 0
