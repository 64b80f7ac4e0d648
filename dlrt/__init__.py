"""dlrt: a single-request inference runtime for block-diffusion language models."""

from typing import Any

from dlrt.errors import CheckpointError, ConfigError, DlrtError, OptionError, PromptError

__version__ = "0.1.0"
__all__ = ["LLM", "BlockOutput", "GenerationResult", "DlrtError", "CheckpointError",
           "ConfigError", "OptionError", "PromptError", "__version__"]


def __getattr__(name: str) -> Any:
    # NOTE: `LLM` and the outputs are imported on first use, so that `import dlrt` (the
    # `dlrt` command's first step) does not import torch before the command can take Ctrl-C
    if name == "LLM":
        from dlrt.llm import LLM as value
    elif name in ("BlockOutput", "GenerationResult"):
        from dlrt import outputs

        value = getattr(outputs, name)
    else:
        raise AttributeError(f"module 'dlrt' has no attribute {name!r}")
    globals()[name] = value
    return value
