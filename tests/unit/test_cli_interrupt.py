"""`dlrt` ends an interrupted command (Ctrl-C: KeyboardInterrupt) with one line on stderr,
"interrupted", and exit status 130, also when the interrupt reaches `main` wrapped in another
error; other errors keep their meaning. In process, with the command replaced."""

from __future__ import annotations

import pytest

from dlrt.entrypoints import cli
from dlrt.errors import OptionError


def run(monkeypatch, capsys, command) -> tuple[int, str]:
    monkeypatch.setattr(cli, "_generate", lambda args: command())
    rc = cli.main(["generate", "--prompt", "x"])
    return rc, capsys.readouterr().err


def interrupt():
    raise KeyboardInterrupt


def interrupt_while_a_class_is_built():
    """Python 3.11 reports a KeyboardInterrupt raised in `__set_name__` as a RuntimeError
    (3.12: as itself): torch builds such classes while it imports lazily, during a load."""
    class Descriptor:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    class Built:  # noqa: F841
        field = Descriptor()


def fail_while_cleaning_up():
    try:
        raise KeyboardInterrupt
    finally:
        raise OSError("cleaning up failed")


@pytest.mark.parametrize("command", [interrupt, interrupt_while_a_class_is_built,
                                     fail_while_cleaning_up])
def test_interrupted_is_one_line_and_130(monkeypatch, capsys, command):
    assert run(monkeypatch, capsys, command) == (130, "interrupted\n")


def test_other_errors_are_not_interrupts(monkeypatch, capsys):
    def fail():
        raise OptionError("--x: bad")

    assert run(monkeypatch, capsys, fail) == (2, "error: --x: bad\n")

    def crash():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run(monkeypatch, capsys, crash)
