"""`dlrt bench quality` on the CPU: the settings, the held-out samples, the scores, and a whole
run on a tiny SDAR model with a small fake corpus (table, JSON record, plot when matplotlib is
installed)."""

from __future__ import annotations

import json

import pytest

from dlrt.bench import quality
from dlrt.entrypoints.cli import main
from dlrt.errors import OptionError
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
    assert quality.until_stop("    y = 1\n# note\ndef g():\n") == "    y = 1"
    assert quality.until_stop("\ndef g():\n") == ""


@pytest.mark.parametrize("which", ["sdar", "bytelevel"])
def test_prompt_cut(tok, bytelevel, which):
    """A prompt ending in a newline loses it where the tokenizer merges newline and indent
    (byte-level BPE), and is kept whole where the newline ends a token (the SDAR tokenizer)."""
    t = {"sdar": tok, "bytelevel": bytelevel}[which]
    prompt = "def f_7(x):\n    if x > 3:\n        return x * 2\n"
    cut = quality.prompt_cut(t, prompt, follow="    return x\n")
    whole = t(prompt + "    return x\n", add_special_tokens=False, return_offsets_mapping=True)
    starts = [a for a, _ in whole["offset_mapping"]]
    assert prompt.startswith(cut) and len(cut) in starts  # a token boundary of the whole
    if which == "sdar":
        assert cut == prompt
    else:
        assert cut == prompt[:-1]  # "\n   " + " return": the model writes the newline
        head = whole["input_ids"][:starts.index(len(cut))]
        assert t.encode(cut, add_special_tokens=False) == head


# files with indented lines, blank lines and lines ending in punctuation, every line unique
HELDOUT = ["".join(f"def f_{f}_{i}(x):\n    if x > {i}:\n        return x * {f}\n\n"
                   for i in range(12)) for f in range(3)]


@pytest.fixture(scope="module")
def bytelevel(tmp_path_factory):
    """A byte-level BPE like the trained default model's (`dlrt.train.tokenizer`): newline
    plus indentation is one pre-token, so its tokens straddle line starts."""
    from dlrt.train.tokenizer import save_tokenizer, train_tokenizer

    out = tmp_path_factory.mktemp("bytelevel")
    save_tokenizer(train_tokenizer(HELDOUT, vocab_size=400), out, model_max_length=4096)
    return load_tokenizer(out)


def _slice_of(ids: list[int], part: list[int]) -> int | None:
    """Where `part` first occurs in `ids` as a contiguous run; None if nowhere."""
    return next((j for j in range(len(ids) - len(part) + 1) if ids[j:j + len(part)] == part),
                None)


@pytest.mark.parametrize("which", ["sdar", "bytelevel"])
def test_heldout_samples(tok, bytelevel, which):
    """Each sample is a run of the whole-file tokenization: prefix + truth == ids[k - p:k + n]
    with p = min(prefix_tokens, k), and token k (the truth's first) is the first token that
    starts at or after a line start c: token k - 1 starts before c, and between c and token
    k's start lies only indentation (nothing unless token k - 1 straddles c, as byte-level
    BPE's newline-plus-indent does). The old cut (prefix and rest tokenized apart) fails the
    first check: its prefix ends in a lone newline token the whole file never has."""
    t = tok if which == "sdar" else bytelevel
    texts = [*HELDOUT, "x = 1\n"]  # too short: never sampled
    whole = [t(x, add_special_tokens=False, return_offsets_mapping=True) for x in texts]
    samples = quality.heldout_samples(t, texts, 5, prefix_tokens=20, new_tokens=12, seed=1)
    assert len(samples) == 5  # three files, cycled
    straddled = 0
    for prefix, truth in samples:
        assert 8 <= len(prefix) <= 20 and len(truth) == 12
        hits = [(f, j) for f, w in enumerate(whole)
                if (j := _slice_of(w["input_ids"], prefix + truth)) is not None]
        assert len(hits) == 1, "prefix + truth is not a run of one file's whole tokenization"
        (f, j), text = hits[0], texts[hits[0][0]]
        k = j + len(prefix)
        assert len(prefix) == min(20, k)
        starts = [a for a, _ in whole[f]["offset_mapping"]]
        at = starts[k]  # where the truth starts in the file
        line = text.rfind("\n", 0, at) + 1  # the start of the line the truth starts in
        assert line > 0 and text[line:at].strip(" \t") == ""
        assert starts[k - 1] < line  # token k is the first at or after the line start
        assert text[at:].startswith(t.decode(truth))
        assert text[:at].endswith(t.decode(prefix))
        straddled += at > line
    if which == "bytelevel":
        assert straddled  # the straddling case is exercised
    else:
        assert not straddled  # the SDAR (Qwen) tokenizer keeps the newline apart from indents
    assert samples == quality.heldout_samples(t, texts, 5, 20, 12, seed=1)  # seeded
    assert samples != quality.heldout_samples(t, texts, 5, 20, 12, seed=2)
    assert quality.heldout_samples(t, ["x = 1\n"], 3, 20, 12) == []


def test_heldout_samples_without_offsets(tok):
    """A tokenizer without offsets (only encode): the cut token is the token count of the
    text before the line start, and the ids still come from the whole-file tokenization."""

    class EncodeOnly:
        def encode(self, text, add_special_tokens=True):
            return tok.encode(text, add_special_tokens=add_special_tokens)

    samples = quality.heldout_samples(EncodeOnly(), HELDOUT, 4, 20, 12, seed=3)
    assert len(samples) == 4
    wholes = [tok.encode(x, add_special_tokens=False) for x in HELDOUT]
    for prefix, truth in samples:
        assert 8 <= len(prefix) <= 20 and len(truth) == 12
        assert any(_slice_of(w, prefix + truth) is not None for w in wholes)


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
        assert 0.0 <= r["empty"] <= 1.0 - r["parses"]
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
    assert main(["bench", "quality", "--model", str(tiny_sdar), "--settings", "fastest"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --settings: unknown setting") and err.count("\n") == 1


def test_score_warms_up_untimed():
    """The first request of a row (two blocks) is not counted in its tokens, rounds or TPS."""
    from types import SimpleNamespace

    calls = []

    class Fake:
        device = SimpleNamespace(type="cpu")
        tokenizer = SimpleNamespace(decode=lambda ids: "x" * len(ids))

        def generate(self, prompt, **options):
            calls.append(options["max_new_tokens"])
            n = options["max_new_tokens"]
            return SimpleNamespace(token_ids=[5] * n, denoise_steps=[2] * (n // 4),
                                   text="    return 1\n")

    row = quality.score(Fake(), 4, {"remasking_strategy": "sequential"}, [([1, 2], [5] * 8)],
                        [], new_tokens=8, humaneval_tokens=16)
    assert calls == [8, 8]  # warm-up (2 blocks of 4), then the held-out sample
    assert row["new_tokens"] == 8 and row["rounds"] == 4 and row["token_accuracy"] == 1.0


def _quality(model_args, tmp_path, *more):
    out = tmp_path / "runs"
    argv = ["bench", "quality", *model_args, "--device", "cpu", "--num-heldout", "1",
            "--new-tokens", "8", "--prefix-tokens", "16", "--humaneval-tokens", "8",
            "--blocks", "4", "--settings", "sequential", "--quiet", "--out", str(out), *more]
    assert main(argv) == 0
    (path,) = out.glob("quality-*.json")
    return json.loads(path.read_text())


def test_no_humaneval_prompts(tiny_sdar, tmp_path, capsys):
    """--num-prompts 0 (documented as "0: none") skips HumanEval: its columns are not
    measured (None in the record, "-" in the table)."""
    record = _quality(["--model", str(tiny_sdar)], tmp_path, "--num-prompts", "0",
                      "--heldout-root", str(_corpus(tmp_path)))
    assert record["humaneval"]["prompts"] == 0
    (row,) = record["rows"]
    assert row["parses"] is None and row["empty"] is None and row["humaneval_prompts"] == 0
    assert row["heldout_samples"] == 1 and 0.0 <= row["token_accuracy"] <= 1.0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if "token_accuracy" in line)
    cells = dict(zip(lines[head].split(), lines[head + 1].split(), strict=True))
    assert cells["parses"] == "-" and cells["empty"] == "-" and cells["setting"] == "sequential"


def test_table_prints_none_as_a_dash():
    from dlrt.bench.report import table

    text = table([{"a": None, "b": 0.5}], ["a", "b"])
    assert text.splitlines()[1].split() == ["-", "0.500"]


@pytest.mark.parametrize("blocks", ["0", "-4", "4,0", "x", "2.5", "", "4,,8"])
def test_blocks_refused_at_parsing(blocks, monkeypatch, capsys):
    """A bad --blocks is refused by the parser, naming the flag, before a model loads."""
    import dlrt

    def boom(*args, **kwargs):
        raise AssertionError("loaded a model before checking --blocks")

    monkeypatch.setattr(dlrt, "LLM", boom)
    with pytest.raises(SystemExit) as info:
        main(["bench", "quality", "--blocks", blocks])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--blocks" in err and "positive integers" in err and "max_new_tokens" not in err


def test_blocks_parsed():
    from dlrt.entrypoints.cli import build_parser

    assert build_parser().parse_args(["bench", "quality", "--blocks", "4, 8"]).blocks == [4, 8]
    assert build_parser().parse_args(["bench", "quality"]).blocks == [4, 8]


def _default_model(tmp_path, monkeypatch, tiny_sdar, python: str | None):
    """A copy of the tiny model as the default model, with a training record naming the
    Python whose library it was trained on (none when `python` is None); the standard
    library replaced by a small fake corpus."""
    import shutil

    import dlrt.checkpoint.default
    import dlrt.train.corpus

    folder = tmp_path / "default-model"
    shutil.copytree(tiny_sdar, folder)
    if python is not None:
        record = {"corpus": {"tree": "/usr/lib/python", "python": python}}
        (folder / "training_record.json").write_text(json.dumps(record))
    monkeypatch.setattr(dlrt.checkpoint.default, "default_model_path", lambda: folder)
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setattr(dlrt.train.corpus, "stdlib_root", lambda: _corpus(lib))
    return folder


@pytest.mark.parametrize("trained", ["2.7.18", "same", None])
def test_heldout_python_versus_the_models(trained, tiny_sdar, tmp_path, monkeypatch, capsys):
    """The default held-out corpus is the running Python's library: a model trained on
    another version's library gets one warning line, and the record holds both versions and
    the default model's folder (not "None")."""
    import platform

    running = platform.python_version()
    python = running if trained == "same" else trained
    folder = _default_model(tmp_path, monkeypatch, tiny_sdar, python)
    record = _quality([], tmp_path, "--num-prompts", "0")
    assert record["model"] == str(folder)
    assert record["heldout"]["python"] == running
    assert record["heldout"]["model_trained_on_python"] == python
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    if trained == "2.7.18":
        (line,) = warnings
        mine = ".".join(running.split(".")[:2])
        assert f"Python {mine}'s library" in line and "2.7's" in line
        assert "not comparable to the model card" in line
    else:
        assert warnings == []


def test_no_warning_for_another_heldout_root(tiny_sdar, tmp_path, monkeypatch, capsys):
    _default_model(tmp_path, monkeypatch, tiny_sdar, "2.7.18")
    root = tmp_path / "other"
    root.mkdir()
    record = _quality([], tmp_path, "--num-prompts", "0", "--heldout-root", str(_corpus(root)))
    assert record["heldout"]["model_trained_on_python"] == "2.7.18"
    assert "warning:" not in capsys.readouterr().err


def _two_settings(tiny_sdar, tmp_path, *more):
    return ["bench", "quality", "--model", str(tiny_sdar), "--device", "cpu",
            "--heldout-root", str(_corpus(tmp_path)), "--num-heldout", "1", "--new-tokens", "4",
            "--prefix-tokens", "16", "--num-prompts", "0", "--blocks", "4",
            "--settings", "sequential,threshold@0.7", "--quiet", "--out",
            str(tmp_path / "runs"), *more]


def test_ctrl_c_keeps_the_finished_settings_and_resume_runs_the_rest(tiny_sdar, tmp_path,
                                                                     monkeypatch, capsys):
    """The record is written after each setting: Ctrl-C in the second keeps the first, says so
    in one line and exits with 130; --resume runs only the second, into the same record."""
    real, calls = quality.score, []

    def interrupted(llm, block, options, *args):
        calls.append(options["remasking_strategy"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(llm, block, options, *args)

    monkeypatch.setattr(quality, "score", interrupted)
    assert main(_two_settings(tiny_sdar, tmp_path)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    (path,) = (tmp_path / "runs").glob("quality-*.json")
    assert err[-1] == (f"interrupted: 1 of 2 setting(s) finished, kept in {path} "
                       f"(--resume {path} runs the rest)")
    assert not any("Traceback" in line for line in err)
    record = json.loads(path.read_text())
    assert record["complete"] is False and record["commit"] and record["device"]
    assert [r["setting"] for r in record["rows"]] == ["sequential"]
    first = record["rows"][0]

    calls.clear()
    monkeypatch.setattr(quality, "score", lambda *a: (calls.append(a[2]), real(*a))[1])
    assert main(_two_settings(tiny_sdar, tmp_path, "--resume", str(path))) == 0
    assert [o["remasking_strategy"] for o in calls] == ["threshold"]
    assert list((tmp_path / "runs").glob("quality-*.json")) == [path]
    record = json.loads(path.read_text())
    assert record["complete"] is True
    assert [r["setting"] for r in record["rows"]] == ["sequential", "threshold@0.7"]
    assert record["rows"][0] == first
    out = capsys.readouterr().out
    assert "sequential" in out and "threshold@0.7" in out  # the table holds both


def test_resume_refuses_a_record_of_other_samples(tiny_sdar, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(quality, "score", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(_two_settings(tiny_sdar, tmp_path)) == 130
    (path,) = (tmp_path / "runs").glob("quality-*.json")
    argv = _two_settings(tiny_sdar, tmp_path, "--resume", str(path))
    argv[argv.index("--new-tokens") + 1] = "5"
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume: {path} was measured with another heldout (")
    assert err.count("\n") == 1
    (tmp_path / "other.json").write_text("[]")
    assert main(_two_settings(tiny_sdar, tmp_path, "--resume", str(tmp_path / "other.json"))) \
        == 2
    assert capsys.readouterr().err.startswith(
        f"error: --resume: {tmp_path / 'other.json'} is not a bench quality record (")


@pytest.fixture
def torch_threads():
    """torch's thread count is restored after the test."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_resume_takes_a_record_of_another_cpu_thread_count(tiny_sdar, tmp_path, monkeypatch,
                                                           torch_threads):
    """With cpu_threads=auto the count follows the machine's load: a record measured with 2
    threads is resumed with 1, and keeps its count."""
    real = quality.score
    monkeypatch.setattr(quality, "score", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(_two_settings(tiny_sdar, tmp_path, "--cpu-threads", "2")) == 130
    (path,) = (tmp_path / "runs").glob("quality-*.json")
    device = json.loads(path.read_text())["device"]
    assert device.startswith("cpu (") and device.endswith(", 2 threads)")
    monkeypatch.setattr(quality, "score", real)
    assert main(_two_settings(tiny_sdar, tmp_path, "--cpu-threads", "1", "--resume",
                              str(path))) == 0
    record = json.loads(path.read_text())
    assert record["complete"] is True and record["device"] == device


def test_resume_compares_the_device_without_the_thread_count(tmp_path):
    from dlrt.bench.quality_record import resumed_rows

    facts = dict(model="m", device="cpu (x86_64, 2 threads)", execution_mode="eager",
                 heldout={}, humaneval={})
    path = tmp_path / "record.json"
    path.write_text(json.dumps(dict(facts, rows=[{"block": 4}])))
    assert resumed_rows(path, dict(facts, device="cpu (x86_64, 7 threads)")) == [{"block": 4}]
    for other in ("cpu (aarch64, 2 threads)", "NVIDIA H100 80GB HBM3"):
        with pytest.raises(OptionError, match="another device"):
            resumed_rows(path, dict(facts, device=other))


def test_the_time_is_estimated_before_the_first_setting_and_after_each(tiny_sdar, tmp_path,
                                                                       monkeypatch):
    from dlrt import progress

    events, real = [], quality.score
    monkeypatch.setattr(progress, "write", events.append)
    monkeypatch.setattr(quality, "score",
                        lambda *a: (events.append(("score", a[2]["remasking_strategy"])),
                                    real(*a))[1])
    assert main(_two_settings(tiny_sdar, tmp_path)) == 0
    first = events.index(("score", "sequential"))
    assert any(isinstance(e, str) and e.startswith("about ") and "for 2 setting(s)" in e
               for e in events[:first])
    after = [e for e in events if isinstance(e, str) and e.startswith("[")]
    assert after[0].startswith("[1/2] block 4 sequential: ") and after[0].endswith(" left")
    assert after[1].startswith("[2/2] block 4 threshold@0.7: ") and after[1].endswith("done")


def test_plot_has_a_title_and_no_label_over_a_point_or_another_label():
    """Close points (as the strategies' often are) got labels written over each other: the
    settings are now a legend beside the axes, and the title names the model."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from dlrt.bench.quality_plot import figure

    labels = [label for label, _ in quality.SETTINGS]
    rows = [dict(block=b, setting=label, tpf=1.0 + 0.01 * i + b / 8,
                 token_accuracy=0.30 + 0.001 * i) for b in (4, 8)
            for i, label in enumerate(labels)]
    rows[3].update(tpf=rows[2]["tpf"], token_accuracy=rows[2]["token_accuracy"])  # alike
    fig = figure(rows, quality.title("sdar-stdlib-8m", [4, 8], 32, 64, 256, "cpu"))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (ax,) = fig.axes
        centres = [tuple(c.get_offset_transform().transform(c.get_offsets())[0].round())
                   for c in ax.collections if len(c.get_offsets())]
        assert len(centres) == len(rows) == len(set(centres))  # no marker hides another
        assert ax.get_title().startswith("sdar-stdlib-8m: greedy, block 4, 8; 32 held-out")
        assert not ax.texts  # no text drawn among the points
        legend = ax.get_legend()
        shown = [t.get_text() for t in legend.get_texts()]
        assert shown == [*labels, "block 4", "block 8"]
        boxes = [t.get_window_extent(renderer) for t in legend.get_texts()]
        boxes += [ax.title.get_window_extent(renderer)]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)
        inside = fig.bbox
        for box in [legend.get_window_extent(renderer), *boxes]:
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 + 1, (box, inside)
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    finally:
        plt.close(fig)


def test_points_that_fall_together_are_set_apart():
    from dlrt.bench.quality_plot import DODGE_PT, dodges

    assert dodges([(1.0, 0.3)]) == [0.0]
    assert dodges([(1.0, 0.3), (2.0, 0.5), (1.0, 0.3), (1.0, 0.3)]) == \
        [-DODGE_PT, 0.0, 0.0, DODGE_PT]


@pytest.mark.parametrize("content", [None, "not json", "[1, 2]", '{"rows": 3}'])
def test_an_unreadable_resume_record_is_refused_before_the_model_loads(tmp_path, monkeypatch,
                                                                        capsys, content):
    import dlrt

    def boom(*args, **kwargs):
        raise AssertionError("loaded the model before reading --resume")

    monkeypatch.setattr(dlrt, "LLM", boom)
    path = tmp_path / "record.json"
    if content is not None:
        path.write_text(content)
    assert main(_two_settings("unused", tmp_path, "--resume", str(path))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --resume: {path} is not a bench quality record"), err


def test_score_shares_a_row_among_data_parallel_groups():
    """With two data-parallel groups each sample and prompt runs once, on one group, each
    group warming up (untimed) on its own share; the row counts both shares, its TPS is all
    tokens over the slower group's seconds, and each group's TPS is given."""
    from types import SimpleNamespace

    ran: list[tuple[int, object, int]] = []  # (group, prompt, max_new_tokens)

    class Rank:
        device = SimpleNamespace(type="cpu")
        tokenizer = SimpleNamespace(decode=lambda ids: "x" * len(ids))
        data_parallel_size = 2

        def __init__(self, group):
            self.data_parallel_rank = group

        def share(self, prompts, **options):  # every other one, as a stand-in
            return [list(range(g, len(prompts), 2)) for g in range(2)]

        def generate(self, prompt, **options):
            n = options["max_new_tokens"]
            ran.append((self.data_parallel_rank, prompt, n))
            return SimpleNamespace(token_ids=[5] * n, denoise_steps=[1] * (n // 2),
                                   text="    return 1\n")

    class Groups(Rank):
        def __init__(self):
            super().__init__(0)
            self.ranks = [Rank(0), Rank(1)]

        def collective_rpc(self, fn, *args):
            return [fn(rank, *args) for rank in self.ranks]

    samples = [([1] * k, [5] * 6) for k in (3, 9, 5, 7)]
    prompts = ["def f():\n", "def longer_name(a, b):\n"]
    row = quality.score(Groups(), 4, {}, samples, prompts, new_tokens=6, humaneval_tokens=12)
    warm = [g for g, _, n in ran if n == 8]  # two blocks of 4, untimed
    assert warm == [0, 1]
    counted = [(g, p) for g, p, n in ran if n != 8]
    assert sorted(str(p) for _, p in counted) == sorted(str(p) for p in
                                                       [s for s, _ in samples] + prompts)
    assert {g for g, _ in counted} == {0, 1}  # both groups ran a share
    assert row["new_tokens"] == 4 * 6 + 2 * 12 and row["token_accuracy"] == 1.0
    assert row["rounds"] == 4 * 3 + 2 * 6 and row["parses"] == 1.0
    assert len(row["group_tps"]) == 2 and row["heldout_samples"] == 4


@pytest.fixture
def llada_with_tokenizer(tiny_llada, tmp_path):
    """The tiny LLaDA checkpoint with the embedded default model's tokenizer (8192 ids, all
    in its vocabulary): text in, the canvas decoder."""
    import shutil

    folder = tmp_path / "llada"
    shutil.copytree(tiny_llada, folder)
    for f in data_path("sdar-stdlib-8m").glob("tokenizer*.json"):
        shutil.copy(f, folder / f.name)
    return folder


@pytest.mark.parametrize("flags,options", [
    (["--canvas-cache", "dual", "--vicinity-before", "1", "--vicinity-after", "2"],
     {"canvas_cache": "dual", "vicinity_before": 1, "vicinity_after": 2}),
    (["--smoothing", "--cont-weight", "0.5", "--threshold-decay", "0.1"],
     {"smoothing": True, "cont_weight": 0.5, "threshold_decay": 0.1})])
def test_request_options_reach_every_request_of_every_setting(llada_with_tokenizer, tmp_path,
                                                              monkeypatch, flags, options):
    """The canvas decoder's cache and smoothing flags go to every request (the warm-up's, the
    held-out and HumanEval ones) of every setting, and into the record."""
    seen = []
    real = quality._generate

    def spy(llm, prompt, opts, stats):
        seen.append(opts)
        return real(llm, prompt, opts, stats)

    monkeypatch.setattr(quality, "_generate", spy)
    settings = "threshold@0.7,threshold@0.9"
    record = _quality(["--model", str(llada_with_tokenizer)], tmp_path, "--heldout-root",
                      str(_corpus(tmp_path)), "--num-prompts", "1", "--settings", settings,
                      *flags)
    assert len(seen) == 3 + 2 * 3  # the probe, then each setting: warm-up, held-out, HumanEval
    assert all(o.items() >= options.items() for o in seen), seen
    assert record["options"] == options
    assert [r["setting"] for r in record["rows"]] == settings.split(",")
    assert all(r["options"].items() >= options.items() for r in record["rows"])


def test_a_setting_that_cannot_take_the_request_options_is_refused_before_loading(capsys):
    """Smoothing is the threshold, credit and hierarchical strategies': with a sequential
    setting the run ends before any model loads, naming the setting and the option."""
    argv = ["bench", "quality", "--model", "/no/such/model", "--smoothing", "--settings",
            "threshold@0.9,sequential"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --settings sequential: --smoothing: smoothing=True works "
                          "only with remasking_strategy in ('threshold', 'credit', "
                          "'hierarchical'), not 'sequential'") and err.count("\n") == 1


def test_resume_compares_the_request_options(tmp_path):
    """A record of other request options is refused; one written before they were recorded
    counts as none given."""
    from dlrt.bench.quality_record import resumed_rows

    facts = dict(model="m", device="cpu (x, 2 threads)", execution_mode="eager",
                 options={"canvas_cache": "dual"}, heldout={}, humaneval={})
    old = {k: v for k, v in facts.items() if k != "options"}
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(dict(old, rows=[{"block": 4}])))
    with pytest.raises(OptionError, match="another options \\(\\{\\}; this run: "):
        resumed_rows(path, facts)
    assert resumed_rows(path, dict(facts, options={})) == [{"block": 4}]
    path.write_text(json.dumps(dict(facts, rows=[{"block": 8}])))
    assert resumed_rows(path, facts) == [{"block": 8}]
