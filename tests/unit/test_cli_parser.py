"""The `dlrt` parser and the bench command's checks, in process: flag values argparse refuses
(exit 2 naming the flag), stop values, help texts, and `bench humaneval` failing before a run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import dlrt
from dlrt.entrypoints.cli import build_parser, decoding_kwargs
from dlrt.entrypoints.cli import main as cli_main


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is loaded: the checks must come first."""
    def boom(*args, **kwargs):
        raise AssertionError("loaded a model before checking the options")

    monkeypatch.setattr(dlrt, "LLM", boom)


def refused(capsys, argv: list[str], flag: str) -> str:
    with pytest.raises(SystemExit) as e:
        cli_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "error:" in ln)
    assert flag in line and "Traceback" not in err, err
    return line


@pytest.mark.parametrize("ids", ["1,a", "1.5", "", " , ", "-1", "1;2", "٣"])
def test_prompt_ids_must_be_token_ids(capsys, no_model, ids):
    line = refused(capsys, ["generate", "--prompt-ids", ids], "--prompt-ids")
    assert repr(ids) in line


def test_prompt_ids_separators():
    args = build_parser().parse_args(["generate", "--prompt-ids", "1, 2 3,4"])
    assert args.prompt_ids == [1, 2, 3, 4]


def test_stop_is_a_token_id_only_when_ascii_digits():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--stop", "12", "--stop=²",
                                      "--stop=--5", "--stop", "-5", "--stop", "٣", "--stop",
                                      "1 2", "--stop", "007"])
    assert decoding_kwargs(args)["stop"] == [12, "²", "--5", "-5", "٣", "1 2", 7]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x"])
def test_max_shard_gb_must_be_finite_and_positive(capsys, tmp_path, value):
    refused(capsys, ["make-checkpoint", "tiny-llada", str(tmp_path / "out"), "--max-shard-gb",
                     value], "--max-shard-gb")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["0", "-2", "1.5"])
def test_num_prompts_must_be_positive(capsys, no_model, value):
    refused(capsys, ["bench", "humaneval", "--num-prompts", value], "--num-prompts")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_renoising_flags():
    """The options of renoising families (DiffusionGemma) as flags, typed as transformers'
    `DiffusionGemmaGenerationConfig` types them."""
    args = build_parser().parse_args([
        "generate", "--prompt", "x", "--max-denoising-steps", "8", "--entropy-bound", "0.3",
        "--t-min", "0", "--t-max", "0.5", "--stability-threshold", "2",
        "--confidence-threshold", "1e-2"])
    kw = decoding_kwargs(args)
    assert kw == {"max_denoising_steps": 8, "entropy_bound": 0.3, "t_min": 0.0, "t_max": 0.5,
                  "stability_threshold": 2, "confidence_threshold": 0.01}
    assert [type(v) for v in kw.values()] == [int, float, float, float, int, float]


def test_help_texts_and_description():
    parser = build_parser()
    assert "bench" in parser.description
    sub = _subparsers(parser)
    commands = {"generate": sub["generate"], "make-checkpoint": sub["make-checkpoint"],
                "bench humaneval": _subparsers(sub["bench"])["humaneval"]}
    for name, p in commands.items():
        for action in p._actions:
            assert action.help, (name, action.option_strings or action.dest)
    helps = {a.dest: a.help for a in sub["generate"]._actions}
    assert "model family" in helps["decoder"]
    assert all(s in helps["threshold"]
               for s in ("low_confidence_dynamic", "threshold", "dynamic_pmax"))


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"dlrt {dlrt.__version__}"


# --- bench humaneval: checks before the run ---------------------------------------------------


def bench_error(capsys, argv: list[str]) -> str:
    assert cli_main(["bench", "humaneval", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return next(ln for ln in err.splitlines() if ln.startswith("error:"))


def test_bench_data_missing_or_malformed(tmp_path, capsys, no_model):
    out = ["--out", str(tmp_path / "results")]
    missing = tmp_path / "nope.jsonl"
    assert str(missing) in bench_error(capsys, ["--data", str(missing), *out])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "T/0", "prompt": "def f():"}\n{not json\n')
    assert "line 2" in bench_error(capsys, ["--data", str(bad), "--num-prompts", "2", *out])
    bad.write_text('{"task_id": "T/0"}\n')
    assert "line 1" in bench_error(capsys, ["--data", str(bad), *out])
    bad.write_text("\n")
    assert "no HumanEval problems" in bench_error(capsys, ["--data", str(bad), *out])


def test_bench_out_not_writable(tmp_path, capsys, no_model):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    line = bench_error(capsys, ["--out", str(a_file / "results")])
    assert "cannot write results" in line and str(a_file) in line


def test_bench_without_tokenizer_labels_ids(tiny_llada, tmp_path, capsys):
    data = tmp_path / "he.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"HumanEval/{i}", "prompt": "def f():"})
                            + "\n" for i in range(3)))
    out = tmp_path / "results"
    assert cli_main(["bench", "humaneval", "--model", str(tiny_llada), "--data", str(data),
                     "--num-prompts", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no tokenizer" in text and "ids-0" in text and "ids-1" in text
    assert "HumanEval/" not in text
    (record,) = out.glob("humaneval-*.json")
    rows = json.loads(record.read_text())["modes"]["eager"]["rows"]
    assert [r["task"] for r in rows] == ["ids-0", "ids-1"]


def test_readme_synopsis_lists_every_generate_flag():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    synopsis = readme[readme.index("dlrt generate ["):readme.index("dlrt bench humaneval")]
    assert "[--model DIR]" in synopsis
    gen = _subparsers(build_parser())["generate"]
    flags = [f for a in gen._actions for f in a.option_strings if f.startswith("--")]
    assert [f for f in flags if f != "--help" and f not in synopsis] == []


def test_readme_and_help_say_the_default_served_model_name():
    from dlrt.server.serve import served_name

    assert served_name(None) == "dlrt-default"  # the embedded default model
    assert served_name("/data/ckpts/SDAR-1.7B-Chat/") == "SDAR-1.7B-Chat"
    assert served_name("JetLM/SDAR-1.7B-Chat") == "SDAR-1.7B-Chat"  # a hub repo id
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    bullet = readme[readme.index("- `--served-model-name NAME`"):]
    bullet = " ".join(bullet[:bullet.index("\n- ")].split())
    assert "`dlrt-default`" in bullet and "repo id" in bullet, bullet
    sv = _subparsers(build_parser())["serve"]
    help_text = next(a.help for a in sv._actions if "--served-model-name" in a.option_strings)
    assert "dlrt-default" in help_text, help_text


@pytest.mark.parametrize("flag,value", [("--temperature", "-1"), ("--top-p", "0"),
                                        ("--block-length", "0"), ("--max-new-tokens", "0"),
                                        ("--remasking-strategy", "foo"), ("--seed", "-1"),
                                        ("--threshold", "1.5"), ("--editing-threshold", "2"),
                                        ("--max-post-steps", "-1"),
                                        ("--low-threshold", "1.5"), ("--credit-decay", "2"),
                                        ("--credit-weight", "-1"), ("--credit-boost", "nan"),
                                        ("--max-denoising-steps", "0"), ("--entropy-bound", "0"),
                                        ("--t-min", "-1"), ("--t-max", "inf"),
                                        ("--stability-threshold", "-1"),
                                        ("--confidence-threshold", "nan")])
@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["serve"],
                                     ["bench", "humaneval"]])
def test_bad_decoding_values_are_refused_before_a_model_loads(capsys, no_model, command, flag,
                                                             value):
    assert cli_main([*command, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}: ") and "Traceback" not in err, err


@pytest.mark.parametrize("flags,variable,key", [
    ([], None, None), ([], "from-env", "from-env"), (["--api-key", "k1"], None, "k1"),
    (["--api-key", "k1"], "from-env", "k1")])
def test_serve_api_key_flag_or_variable(monkeypatch, no_model, flags, variable, key):
    """--api-key wins over DLRT_API_KEY; --served-model-name reaches the server."""
    from dlrt.server import serve

    seen = {}
    monkeypatch.setattr(serve, "serve", lambda *a, **kw: seen.update(kw) or 0)
    if variable is None:
        monkeypatch.delenv("DLRT_API_KEY", raising=False)
    else:
        monkeypatch.setenv("DLRT_API_KEY", variable)
    assert cli_main(["serve", "--served-model-name", "my-model", *flags]) == 0
    assert seen == {"served_model_name": "my-model", "api_key": key}
