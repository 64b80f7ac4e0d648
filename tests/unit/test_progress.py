"""Long operations say what they do: tqdm bars on stderr while loading and writing checkpoints
(on a terminal, not with --quiet), all made by `dlrt.progress`."""

from __future__ import annotations

import sys

import pytest

from dlrt import LLM, progress
from dlrt.entrypoints.cli import main


class Terminal:
    """A stderr that says it is a terminal and keeps what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        pass


@pytest.fixture
def terminal(monkeypatch):
    """Installs a Terminal as sys.stderr when called (inside the test: pytest's capture sets
    its own stderr after fixtures are set up)."""
    def install():
        term = Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        return term
    progress.set_quiet(False)  # an earlier test's --quiet
    yield install
    progress.set_quiet(False)


def test_bars_on_a_terminal(terminal, tiny_sdar, tmp_path):
    terminal = terminal()
    assert progress.enabled()
    assert main(["make-checkpoint", "tiny-sdar", str(tmp_path / "m"), "--dtype", "float32"]) == 0
    assert "writing m" in terminal.text and "tensor" in terminal.text
    LLM(tiny_sdar, device="cpu")
    assert "loading ckpt" in terminal.text


def test_quiet_and_not_a_terminal(terminal, tmp_path, monkeypatch):
    terminal = terminal()
    assert main(["make-checkpoint", "tiny-sdar", str(tmp_path / "a"), "--quiet"]) == 0
    assert terminal.text == "" and not progress.enabled()
    progress.set_quiet(False)
    monkeypatch.setattr(terminal, "isatty", lambda: False)
    assert main(["make-checkpoint", "tiny-sdar", str(tmp_path / "b")]) == 0
    assert terminal.text == ""


def test_every_bar_is_made_by_progress():
    """Bars are drawn only on a terminal and off with --quiet because one module makes them
    all: no other module of the package imports tqdm."""
    import re
    from pathlib import Path

    import dlrt

    imports = re.compile(r"^\s*(import tqdm|from tqdm\b)", re.M)
    root = Path(dlrt.__file__).parent
    others = [str(p.relative_to(root)) for p in root.rglob("*.py")
              if p.name != "progress.py" and imports.search(p.read_text())]
    assert others == []


def test_bench_quality_draws_no_bar_into_a_redirected_stderr(tiny_sdar, tmp_path, capsys):
    """Not a terminal, not --quiet: the progress lines are there, the bar is not."""
    from test_bench_quality import _corpus

    assert main(["bench", "quality", "--model", str(tiny_sdar), "--device", "cpu",
                 "--heldout-root", str(_corpus(tmp_path)), "--num-heldout", "1",
                 "--new-tokens", "4", "--prefix-tokens", "16", "--num-prompts", "0",
                 "--blocks", "4", "--settings", "sequential", "--out",
                 str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert "[1/1] block 4 sequential" in err
    assert "settings:" not in err and "it/s" not in err and "setting/s" not in err, err
