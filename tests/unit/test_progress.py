"""Long operations say what they do: tqdm bars on stderr while loading and writing checkpoints
(on a terminal, not with --quiet)."""

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
