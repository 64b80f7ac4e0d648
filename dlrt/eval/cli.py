"""`dlrt eval ...`: the harness's own command line (`lm_eval ...`, the same arguments) with the
`dlrt` model registered first. lm-eval 0.4 has no plugin entry points for models, so its
`lm_eval` command knows only the models of its own tree; this one also knows `--model dlrt`."""

from __future__ import annotations

import sys

from dlrt.errors import OptionError


def main(argv: list[str]) -> int:
    """Run the harness's command line on `argv` (its arguments, after `dlrt eval`); 0 when it
    returns (its own errors exit as it exits them).

    Raises:
        OptionError: lm-eval is not installed.
    """
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise OptionError("`dlrt eval` needs EleutherAI's lm-evaluation-harness: "
                          "pip install 'dlrt[eval]'") from e
    from lm_eval.__main__ import cli_evaluate

    import dlrt.eval.harness  # noqa: F401  (registers the `dlrt` model)

    saved = sys.argv
    sys.argv = ["dlrt eval", *argv]  # NOTE: the harness's parser reads sys.argv
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
