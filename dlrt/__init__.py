"""dlrt: a single-request inference runtime for block-diffusion language models."""

from dlrt.errors import CheckpointError, ConfigError, DlrtError, OptionError, PromptError
from dlrt.llm import LLM
from dlrt.outputs import BlockOutput, GenerationResult

__version__ = "0.1.0"
__all__ = ["LLM", "BlockOutput", "GenerationResult", "DlrtError", "CheckpointError",
           "ConfigError", "OptionError", "PromptError", "__version__"]
