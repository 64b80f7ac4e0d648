"""The engine: `config` (`EngineConfig`, every engine option, resolved once for a checkpoint
and device) and `engine` (`Engine`, which builds the parts a request runs on from it)."""

from dlrt.engine.config import EngineConfig
from dlrt.engine.engine import Engine

__all__ = ["Engine", "EngineConfig"]
