"""`dlrt bench quality` on the CPU: the settings, the held-out samples, the scores, and a whole
run on a tiny SDAR model with a small fake corpus (table, JSON record, plot when matplotlib is
installed)."""

from __future__ import annotations

import json

import pytest

from dlrt.bench import quality
from dlrt.entrypoints.cli import main
from dlrt.resources import data_path
from dlrt.tokenizer import load_tokenizer
from dlrt.train.corpus import is_held_out


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(data_path("sdar-qwen3"))


def test_settings():
    every = quality.settings(None)
    strategies = {o["remasking_strategy"] for _, o in every}
    assert {"sequential", "low_confidence_static", "low_confidence_dynamic", "threshold",
            "entropy_bounded", "dynamic_pmax", "random", "credit", "hierarchical"} == strategies
    assert [lb for lb, _ in every if lb.startswith("low_confidence_dynamic@")] == [
        f"low_confidence_dynamic@{t}" for t in (0.7, 0.8, 0.9, 0.95)]
    picked = quality.settings("threshold, sequential,threshold@0.9")
    assert [lb for lb, _ in picked] == ["threshold@0.7", "threshold@0.9", "sequential"]
    with pytest.raises(ValueError, match="unknown setting 'nope'"):
        quality.settings("nope")


def test_first_line_and_parses():
    assert quality.first_line_match("    return x\n    y = 1", "    return x\nfoo")
    assert not quality.first_line_match("    return y\n", "    return x\n")
    assert not quality.first_line_match("    return x", "    return x\n")  # newline missing
    assert quality.first_line_match("ab", "ab")  # truth without newline: all of it
    prompt = "def f(x):\n    \"\"\"Double.\"\"\"\n"
    assert quality.parses(prompt, "    return 2 * x\n\ndef g(:\n")  # cut at the next def
    assert not quality.parses(prompt, "    return (2 * x\n")
    assert quality.parses(prompt, "")  # the docstring is a body
    assert not quality.parses("def f(x):\n", "")  # a def without one


def test_heldout_samples(tok):
    texts = ["".join(f"value_{f}_{i} = {i} * {f}\n" for i in range(40)) for f in range(3)]
    texts.append("x = 1\n")  # too short: never sampled
    samples = quality.heldout_samples(tok, texts, 5, prefix_tokens=20, new_tokens=12, seed=1)
    assert len(samples) == 5  # three files, cycled
    for prefix, truth in samples:
        assert 8 <= len(prefix) <= 20 and len(truth) == 12
        assert tok.decode(prefix).endswith("\n")  # the cut is a line start
        whole = next(t for t in texts if tok.decode(prefix) in t)
        at = whole.index(tok.decode(prefix)) + len(tok.decode(prefix))
        assert whole[at:].startswith(tok.decode(truth))
    assert samples == quality.heldout_samples(tok, texts, 5, 20, 12, seed=1)  # seeded
    assert samples != quality.heldout_samples(tok, texts, 5, 20, 12, seed=2)
    assert quality.heldout_samples(tok, ["x = 1\n"], 3, 20, 12) == []


def _corpus(root, files=4):
    """A folder whose held-out split has `files` files (and a training file)."""
    held = [n for n in (f"mod_{i}.py" for i in range(2000)) if is_held_out(n)][:files]
    train = next(n for n in (f"mod_{i}.py" for i in range(2000)) if not is_held_out(n))
    for n in held + [train]:
        (root / n).write_text("".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(30)))
    return root


def test_run_and_the_record(tiny_sdar, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["bench", "quality", "--model", str(tiny_sdar), "--device", "cpu",
                 "--heldout-root", str(_corpus(tmp_path)), "--num-heldout", "2",
                 "--new-tokens", "8", "--prefix-tokens", "32", "--num-prompts", "2",
                 "--humaneval-tokens", "8", "--blocks", "4",
                 "--settings", "sequential,threshold@0.7", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "token_accuracy" in printed and "threshold@0.7" in printed
    (path,) = out.glob("quality-*.json")
    record = json.loads(path.read_text())
    rows = record["rows"]
    assert [(r["block"], r["setting"]) for r in rows] == [(4, "sequential"), (4, "threshold@0.7")]
    assert record["heldout"]["samples"] == 2 and record["humaneval"]["prompts"] == 2
    for r in rows:
        assert 0.0 <= r["token_accuracy"] <= 1.0 and 0.0 <= r["parses"] <= 1.0
        # held out: exactly 8 tokens a sample (EOS ignored); HumanEval: up to 8 a prompt
        assert r["rounds"] > 0 and 2 * 8 <= r["new_tokens"] <= 2 * 8 + 2 * 8
        assert r["tpf"] == pytest.approx(r["new_tokens"] / r["rounds"])
    # sequential commits one token a round: never more than one token per forward
    assert rows[0]["tpf"] <= 1.0 and rows[0]["rounds_per_block"] <= 4.0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot: matplotlib is not installed" in printed
    else:
        assert path.with_suffix(".png").stat().st_size > 1000


def test_errors(tiny_sdar, capsys):
    with pytest.raises(SystemExit, match="--settings: unknown setting"):
        main(["bench", "quality", "--model", str(tiny_sdar), "--settings", "fastest"])
