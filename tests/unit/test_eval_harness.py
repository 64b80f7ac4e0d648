"""lm-evaluation-harness with the `dlrt` model on the embedded default model, offline, over two
tasks defined here (JSONL files and task YAMLs in a temp folder, `dataset_path: json`): a
generate_until task and a multiple_choice one. `simple_evaluate` runs them end to end twice
with the same numbers; the answers are `LLM.generate`'s and the estimator's for the same
prompts; chat templates and the model arguments behave as the CLI's options; `dlrt eval` (the
harness's command line) gives the same numbers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")  # the eval extra (in the test extra)
from lm_eval.tasks import TaskManager  # noqa: E402

from dlrt.decoding.options import DecodingOptions  # noqa: E402
from dlrt.errors import OptionError, PromptError  # noqa: E402
from dlrt.eval.harness import DlrtLM  # noqa: E402
from dlrt.eval.likelihood import LikelihoodEstimator  # noqa: E402
from dlrt.eval.model_args import known_names, parse_model_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GEN = [{"prompt": "def add(a, b):\n    ", "answer": "return a + b"},
       {"prompt": "import os\nimport ", "answer": "sys"},
       {"prompt": "class Point:\n    def __init__(self", "answer": ", x, y):"}]
MC = [{"prompt": "import ", "choices": ["os", "]]]"], "label": 0},
      {"prompt": "def f(x):\n    return ", "choices": ["(((", "x + 1"], "label": 1}]
MODEL_ARGS = "mc_num=4"


def write_tasks(folder: Path) -> Path:
    """The two tasks' data and YAMLs in `folder`/tasks (datasets' cache beside them)."""
    tasks = folder / "tasks"
    tasks.mkdir(parents=True)
    for name, rows in (("gen", GEN), ("mc", MC)):
        (tasks / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = f"""dataset_path: json
dataset_kwargs:
  cache_dir: {folder / "datasets"}
"""
    (tasks / "dlrt_gen.yaml").write_text(f"""task: dlrt_gen
{data}  data_files:
    test: {tasks / "gen.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""")
    (tasks / "dlrt_mc.yaml").write_text(f"""task: dlrt_mc
{data}  data_files:
    test: {tasks / "mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")
    return tasks


def evaluate(model, tasks: Path, **kw) -> dict:
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, model_args=MODEL_ARGS, device="cpu",
                                   tasks=["dlrt_gen", "dlrt_mc"], task_manager=manager, **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tasks' folder and two runs of `simple_evaluate(model="dlrt", ...)`."""
    tasks = write_tasks(tmp_path_factory.mktemp("eval"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        return tasks, [evaluate("dlrt", tasks, log_samples=True) for _ in range(2)]


@pytest.fixture(scope="module")
def lm():
    return DlrtLM(mc_num=4, device="cpu")


def _answers(result: dict, task: str) -> list:
    """(request arguments, answers) of each document: [(context, generation keys)], [[text]]
    or [(context, continuation), ...], [[(loglikelihood, is_greedy)], ...]."""
    return [([tuple(a) for a in s["arguments"]], s["resps"]) for s in result["samples"][task]]


def _logged(line: str) -> tuple:
    """A line of the harness's samples file as `_answers` gives it (the file holds arguments
    as {"gen_args_K": {"arg_0", "arg_1"}} and numbers as strings)."""
    s = json.loads(line)
    args = [(a["arg_0"], a["arg_1"]) for a in s["arguments"].values()]
    resps = [[r[0]] if isinstance(r[0], str) and isinstance(args[0][1], dict)
              else [(float(r[0][0]), r[0][1] == "True")] for r in s["resps"]]
    return args, resps


def test_two_runs_give_the_same_numbers(runs):
    _, (a, b) = runs
    assert a["results"] == b["results"]
    for task in ("dlrt_gen", "dlrt_mc"):
        assert _answers(a, task) == _answers(b, task)
        assert len(a["samples"][task]) == (3 if task == "dlrt_gen" else 2)
    assert a["results"]["dlrt_mc"]["acc,none"] == 1.0  # the trained model knows Python a bit
    info = a["config"]["dlrt"]
    assert info["mc_num"] == 4 and info["family"] == "sdar"
    assert info["generate_until"]["requests"] == 3
    assert info["loglikelihood"]["requests"] == 4


def test_generations_are_llm_generate_s(runs, lm):
    _, (a, _) = runs
    for ((context, gen),), resps in _answers(a, "dlrt_gen"):
        assert gen == {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}
        want = lm.llm.generate(context, max_new_tokens=12, stop=["\n"], temperature=0).text
        assert resps == [[want]]


def test_loglikelihoods_are_the_estimator_s(runs, lm):
    _, (a, _) = runs
    est = LikelihoodEstimator(lm.llm, mc_num=4, seed=0)
    for args, resps in _answers(a, "dlrt_mc"):
        assert resps == [[est.loglikelihood(*lm._encode_pair(*pair))] for pair in args]


def test_chat_template(runs, lm):
    """--apply_chat_template: the prompt is the tokenizer's template over the context as a
    user message, and the answer LLM.generate's for that text."""
    tasks, _ = runs
    result = lm_eval.simple_evaluate(
        model=lm, tasks=["dlrt_gen"], limit=1, apply_chat_template=True,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    ((((prompt, _),), resps),) = _answers(result, "dlrt_gen")
    assert prompt == lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": GEN[0]["prompt"]}], tokenize=False,
        add_generation_prompt=True)
    assert prompt.startswith("# ")  # the default model's template writes comment lines
    assert resps == [[lm.llm.generate(prompt, max_new_tokens=12, stop=["\n"],
                                      temperature=0).text]]
    assert lm.tokenizer_name == str(lm.tokenizer.name_or_path).replace("/", "__")


def test_request_options(lm):
    opts = lm.request_options({"until": ["Q:", "\n\n"], "max_gen_toks": 7, "do_sample": False,
                               "top_k": 3})
    assert opts == {"stop": ["Q:", "\n\n"], "max_new_tokens": 7, "temperature": 0.0,
                    "top_k": 3}
    assert lm.request_options({"until": "Q:"})["max_new_tokens"] == 256
    with pytest.raises(OptionError, match=r"generation key\(s\) \['repetition_penalty'\]"):
        lm.request_options({"until": [], "repetition_penalty": 1.1})
    with pytest.raises(OptionError, match="top_p"):
        lm.request_options({"top_p": 2.0})


def test_a_long_context_keeps_its_last_tokens(lm):
    """As the harness's Hugging Face model: the prompt keeps the tail that fits the model's
    context (1024) with the new tokens and the block decoder's last block; a continuation that
    cannot fit is a named error."""
    text = "x = 1\n" * 600
    ids = lm.llm.encode(text)
    assert len(ids) > 1024
    kept = lm.prompt_ids(text, lm.request_options({"max_gen_toks": 16}))
    assert kept == ids[len(ids) - len(kept):] and 1024 - 16 - 4 < len(kept) <= 1024 - 16
    lm.llm.check(kept, max_new_tokens=16)
    with pytest.raises(PromptError, match="continuation of 1030 tokens"):
        lm._loglikelihood_tokens([(("a", "b"), [1, 2], list(range(3, 1033)))])


def test_rolling_loglikelihood_is_refused(lm):
    with pytest.raises(OptionError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([])


def test_model_args_are_the_cli_s_options():
    """Every engine and decoding flag of `dlrt generate` is a model argument of the same name;
    values are checked as there; unknown names are named."""
    from dlrt.entrypoints.cli import build_parser

    gen = build_parser()._subparsers._group_actions[0].choices["generate"]
    flags = {a.dest for a in gen._actions if a.option_strings} - {
        "help", "prompt", "prompt_ids", "chat", "json", "quiet"}
    assert flags <= set(known_names()), flags - set(known_names())
    parsed = parse_model_args({"pretrained": "m", "load_seed": 3, "seed": 5, "dtype": "float32",
                               "threshold": 0.5, "stop": "Q:", "mc_num": 8, "batch_size": 1,
                               "device": "cpu"})
    assert parsed.engine == {"model": "m", "seed": 3, "dtype": "float32", "device": "cpu"}
    assert parsed.decoding == {"seed": 5, "threshold": 0.5, "stop": "Q:"}
    assert (parsed.mc_num, parsed.seed, parsed.check_greedy) == (8, 5, True)
    for bad, match in (({"thresold": 0.5}, r"unknown model argument\(s\) \['thresold'\]"),
                       ({"threshold": 2.0}, "threshold"),
                       ({"dtype": "float8"}, "dtype"),
                       ({"remasking_strategy": "best"}, "remasking_strategy"),
                       ({"pretrained": "a", "model": "b"}, "pretrained or model"),
                       ({"mc_num": 0}, "mc_num"), ({"check_greedy": "yes"}, "check_greedy")):
        with pytest.raises(OptionError, match=match):
            parse_model_args(bad)
    names = {f.name for f in dataclasses.fields(DecodingOptions)}
    assert names <= set(known_names())


def test_a_bad_model_argument_is_named_before_loading():
    """The harness builds the model from its `--model_args` string; an unknown name or a bad
    value is one named error, before any checkpoint is read."""
    with pytest.raises(OptionError, match=r"unknown model argument\(s\) \['thresold'\]"):
        DlrtLM.create_from_arg_string("mc_num=4,thresold=0.5", {"device": "cpu"})
    with pytest.raises(OptionError, match="block_length"):
        DlrtLM.create_from_arg_string("pretrained=/nowhere,block_length=0", {"device": "cpu"})


@pytest.mark.slow
def test_the_harness_command_line_gives_the_same_numbers(runs, tmp_path):
    """`dlrt eval --model dlrt ...` (lm_eval's own arguments) in a subprocess: the numbers and
    answers of `simple_evaluate`."""
    tasks, (a, _) = runs
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": path}
    run = subprocess.run(
        [sys.executable, "-m", "dlrt", "eval", "--model", "dlrt", "--model_args", MODEL_ARGS,
         "--device", "cpu", "--tasks", "dlrt_gen", "dlrt_mc", "--include_path", str(tasks),
         "--output_path", str(tmp_path / "out"), "--log_samples"],
        env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (record,) = (tmp_path / "out").glob("*/results_*.json")
    assert json.loads(record.read_text())["results"] == a["results"]
    for task in ("dlrt_gen", "dlrt_mc"):
        (samples,) = (tmp_path / "out").glob(f"*/samples_{task}_*.jsonl")
        assert [_logged(line) for line in samples.read_text().splitlines()] == \
            _answers(a, task)
