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


def test_an_interrupt_during_the_imports_comes_after_them():
    """A Ctrl-C while the libraries load is held until they are whole, then raised: half-made
    modules (numpy refusing to load twice) or a lost interrupt came from one in an import."""
    import signal

    order = []
    with pytest.raises(KeyboardInterrupt):
        with cli._interrupt_after():
            # NOTE: to this thread: a signal sent to the process may land on another thread
            # (pytest-xdist's), and the handler then runs some bytecodes later
            signal.raise_signal(signal.SIGINT)
            order.append("imports done")
        order.append("after the block")
    assert order == ["imports done"]


@pytest.mark.parametrize("argv, flag", [
    (["generate", "--prompt", "x", "--block-length", "four"], "--block-length"),
    (["generate", "--prompt", "x", "--bogus"], "--bogus"),
    (["bench", "step", "--rounds", "x"], "--rounds"),
    ([], "command"),
])
def test_a_bad_flag_is_one_error_line(capsys, argv, flag):
    """argparse's own errors too: one `error:` line naming the flag and where the flags are
    listed, not the usage block, and exit status 2."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: dlrt") and flag in err, err
    assert "--help` lists" in err and "usage:" not in err
