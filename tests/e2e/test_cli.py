"""The `dlrt` command line, run as a user runs it (a subprocess), against the Python API, and
the embedded default model behind both (the packaged `dlrt/data/sdar-stdlib-8m`).

The commands start together in a few worker threads (each pays the torch import); the
default-model commands run with a fresh cache folder, which they must leave unwritten."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlrt import LLM, GenerationResult
from dlrt.checkpoint.default import default_model_path
from dlrt.checkpoint.make import make_checkpoint
from dlrt.entrypoints.cli import main as cli_main
from dlrt.resources import data_path

REPO = Path(__file__).resolve().parents[2]
PY_M = [sys.executable, "-m", "dlrt"]
GREEDY8 = ["--max-new-tokens", "8", "--temperature", "0"]
# NOTE: the prompt ends on the newline-plus-indent token that starts a function body in the
# training corpus; ending on a bare "\n" cuts that token and the model writes a docstring.
PY_PROMPT = "def fibonacci(n):\n    "
PY_KEYWORD = re.compile(r"\b(return|if|for|while)\b|=")


def console_script() -> str | None:
    """The `dlrt` entry point of this interpreter's environment, else the one on PATH."""
    here = Path(sys.executable).parent / "dlrt"
    return str(here) if here.is_file() else shutil.which("dlrt")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def same_params(a: LLM, b: LLM) -> None:
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert pa.keys() == pb.keys()
    for name, t in pa.items():
        assert t.dtype == pb[name].dtype and torch.equal(t, pb[name]), name


@pytest.fixture(scope="module")
def paths(tmp_path_factory, tiny_sdar) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    return {"root": root, "cache": root / "fresh-cache", "made": root / "made-sdar",
            "tool": root / "tool-llada", "nowhere": root / "no-such-model",
            "tiny_sdar": tiny_sdar}


@pytest.fixture(scope="module")
def runs(paths) -> dict[str, subprocess.CompletedProcess]:
    # NOTE: one thread per process: the workers together use the cores without OpenMP
    # oversubscription (greedy tokens do not depend on the thread count).
    shared = dict(os.environ, PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1")
    fresh = dict(shared, DLRT_CACHE_DIR=str(paths["cache"]))
    model = ["--model", str(paths["tiny_sdar"])]
    script = console_script()
    cmds = {
        "text": (PY_M + ["generate", "--prompt", "hello", *GREEDY8], fresh),
        # the console script when installed (else `python -m dlrt`), on the same default
        "json": (([script] if script else PY_M)
                 + ["generate", "--prompt", "hello", "--json", *GREEDY8], fresh),
        "chat": (PY_M + ["generate", "--prompt", "hello", "--chat", "--json", *GREEDY8], fresh),
        "python": (PY_M + ["generate", "--prompt", PY_PROMPT, "--max-new-tokens", "48",
                           "--temperature", "0", "--device", "cpu"], fresh),
        "ids": (PY_M + ["generate", *model, "--prompt-ids", "1, 2 3", "--json", *GREEDY8],
                shared),
        "block0": (PY_M + ["generate", *model, "--prompt", "hello", "--block-length", "0"],
                   shared),
        "strategy": (PY_M + ["generate", *model, "--prompt", "hello",
                             "--remasking-strategy", "nope"], shared),
        "nowhere": (PY_M + ["generate", "--model", str(paths["nowhere"]), "--prompt", "hello"],
                    shared),
        "make": (PY_M + ["make-checkpoint", "tiny-sdar", str(paths["made"]), "--seed", "3"],
                 shared),
        "tool": ([sys.executable, str(REPO / "tools" / "make_checkpoint.py"), "tiny-llada",
                  str(paths["tool"]), "--seed", "5", "--num-layers", "1"], shared),
    }

    def run(item):
        argv, env = item
        return subprocess.run(argv, env=env, cwd=paths["root"], capture_output=True,
                              text=True, encoding="utf-8", timeout=300)

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        done = dict(zip(cmds, pool.map(run, cmds.values()), strict=True))
    return done


@pytest.fixture(scope="module")
def default_llm() -> LLM:
    return LLM()


@pytest.fixture(scope="module")
def want(default_llm) -> dict[str, GenerationResult]:
    """The API's greedy results on the embedded default, for the CLI to match."""
    return {"plain": default_llm.generate("hello", 8, temperature=0),
            "chat": default_llm.generate("hello", 8, chat=True, temperature=0)}


def ok(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    return run


def test_generate_text_on_embedded_default(runs, want):
    run = ok(runs["text"])
    plain = want["plain"]
    assert plain.text.strip() and 1 <= len(plain.token_ids) <= 8
    assert run.stdout == plain.text + "\n"
    assert f"[finish_reason={plain.finish_reason}]" in run.stderr


def test_generate_python_on_embedded_default(runs):
    """No --model, CPU, greedy: the default model writes something that looks like Python."""
    text = ok(runs["python"]).stdout
    assert text.strip()
    assert PY_KEYWORD.search(text), text
    assert "<|" not in text, text


def test_generate_json_matches_the_api(runs, default_llm, want):
    result = json.loads(ok(runs["json"]).stdout)
    assert result["token_ids"] == want["plain"].token_ids
    assert result["text"] == want["plain"].text
    assert result["prompt_token_ids"] == default_llm.encode("hello")
    assert result["finish_reason"] == want["plain"].finish_reason
    assert result["stop_reason"] == want["plain"].stop_reason
    assert sum(result["denoise_steps"]) == result["timings"]["rounds"]


def test_generate_chat(runs, default_llm, want):
    result = json.loads(ok(runs["chat"]).stdout)
    ids = default_llm.encode("hello", chat=True)
    assert result["prompt_token_ids"] == ids != default_llm.encode("hello")
    assert default_llm.tokenizer.decode(ids) == "# hello\n"  # a code comment
    assert result["token_ids"] == want["chat"].token_ids != want["plain"].token_ids


def test_generate_prompt_ids_with_model(runs, paths):
    result = json.loads(ok(runs["ids"]).stdout)
    assert result["prompt_token_ids"] == [1, 2, 3]
    api = LLM(paths["tiny_sdar"]).generate([1, 2, 3], 8, temperature=0)
    assert result["token_ids"] == api.token_ids and len(api.token_ids) == 8
    assert result["finish_reason"] == api.finish_reason == "length"


@pytest.mark.parametrize("key,words", [
    ("block0", ["block_length", "0"]),
    ("strategy", ["remasking_strategy", "'nope'"]),
    ("nowhere", ["no-such-model", "does not exist"]),
])
def test_bad_options_exit_2(runs, key, words):
    run = runs[key]
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    line = next(ln for ln in run.stderr.splitlines() if ln.startswith("error:"))
    for w in words:
        assert w in line, line


def test_bad_flag_type_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["generate", "--prompt", "x", "--block-length", "four"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--block-length" in err and "'four'" in err


def test_make_checkpoint_command(runs, paths):
    run = ok(runs["make"])
    assert run.stdout.strip() == str(paths["made"])
    made = LLM(paths["made"], dtype="bfloat16")
    same_params(made, LLM(paths["made"], dtype="bfloat16", load_format="dummy", seed=3))
    assert made.tokenizer is not None and made.config.num_layers == 2
    assert weights(paths["made"])["lm_head.weight"].dtype == torch.bfloat16


def test_make_checkpoint_tool_script(runs, paths, tmp_path):
    ok(runs["tool"])
    cfg = json.loads((paths["tool"] / "config.json").read_text())
    assert cfg["n_layers"] == 1 and cfg["model_type"] == "llada"
    api = weights(make_checkpoint("tiny-llada", tmp_path / "api", seed=5, num_layers=1))
    got = weights(paths["tool"])
    assert got.keys() == api.keys()
    for k in api:
        assert torch.equal(got[k], api[k]), k


def test_cli_default_model_writes_nothing(runs, paths):
    """The default ships in the package: the CLI runs on it leave their cache folder unmade."""
    for key in ("text", "json", "chat", "python"):
        ok(runs[key])
    assert not paths["cache"].exists()


def test_api_default_model(default_llm, want):
    path = default_model_path()
    assert path == data_path("sdar-stdlib-8m")
    assert default_llm.folder.path == path
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "sdar"
    assert weights(path)["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert sum(p.numel() for p in default_llm.model.parameters()) <= 8_000_000
    same_params(LLM(dtype="bfloat16"), LLM(path, dtype="bfloat16"))
    again = LLM().generate("hello", 8, temperature=0)
    assert again.token_ids == want["plain"].token_ids and again.text == want["plain"].text
