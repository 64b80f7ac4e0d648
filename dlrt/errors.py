"""Errors raised by dlrt. Every error names the problem; the server maps them to 4xx answers."""


class DlrtError(Exception):
    """Base class of every error dlrt raises on purpose."""


class CheckpointError(DlrtError):
    """A checkpoint folder is unusable: missing file, missing or mis-shaped tensor, bad format."""


class ConfigError(DlrtError):
    """A `config.json` names an unknown `model_type`, lacks a field the family needs, or holds
    a field of the wrong type or out of range (the message names the field and value)."""


class OptionError(DlrtError, ValueError):
    """A user option (decoding or engine) has a bad value."""


class PromptError(DlrtError, ValueError):
    """A prompt is empty, has a bad type, or does not fit in the context."""


class NumericalError(DlrtError):
    """The model produced non-finite logits (NaN or infinity) where a round decides tokens:
    broken weights, or activations past the dtype's range. Nothing of the block is output."""


class RankError(DlrtError):
    """Under torchrun: another rank failed a call that every rank runs (the message names the
    rank and its error), or the ranks cannot go on together."""


class AsleepError(DlrtError):
    """The call needs an awake engine and this one is asleep (`LLM.sleep`): the message names
    the level and how to wake it (`wake_up`, or for weights dropped by level 2 a checkpoint
    folder or `update_weights` first)."""


class WeightsError(DlrtError, ValueError):
    """Weights given to `LLM.update_weights` (or `wake_up(path)`) do not fit the model: the
    message lists the unknown names, the missing ones, the wrong shapes and the dtypes that
    cannot be cast, and says whether anything was updated."""
