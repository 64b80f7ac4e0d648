"""Sleep, wake and in-place weight updates of an `Engine` (`LLM.sleep`, `LLM.wake_up`,
`LLM.update_weights`): the states and the checks; the mechanics are `dlrt.engine.sleep` (the
device memory) and `dlrt.checkpoint.update` (the weights).

States: awake (`sleeping` None); asleep at level 1 (weights in CPU memory); asleep at level 2
with the weights dropped, or brought back by an update (`Sleep.weights_back`: on the device,
the rest still freed). Updates and wakes are checked first (`plan_update`, `plan_wake`: nothing
changes when they fail) and applied after (`apply_update`, `wake_up`), so that under tensor
parallelism every rank checks before any rank copies.
"""

from __future__ import annotations

from typing import Any

import torch

from dlrt.checkpoint.update import Update, open_source, plan_update
from dlrt.engine.sleep import drop_weights, fall_asleep, restore_weights, wake
from dlrt.errors import AsleepError, OptionError


def check_level(level: Any) -> None:
    """Raises OptionError for a sleep level other than 1 or 2."""
    if level not in (1, 2) or isinstance(level, bool):
        raise OptionError(f"sleep level must be 1 (weights kept in CPU memory) or 2 "
                          f"(weights dropped), got {level!r}")


class Lifecycle:
    """The sleep / wake / update methods of `Engine` (which holds `sleeping`, `model`,
    `runner` and `config`)."""

    sleeping = None  # a `dlrt.engine.sleep.Sleep` while asleep (the engine's field)

    @property
    def sleep_level(self) -> int:
        """0 awake; else the level of `sleep` (1: weights in CPU memory; 2: dropped)."""
        return 0 if self.sleeping is None else self.sleeping.level

    def check_awake(self, what: str) -> None:
        """Raises AsleepError naming `what` (the call refused) while asleep."""
        s = self.sleeping
        if s is None:
            return
        how = "wake_up()" if s.weights_held else \
            "wake_up(checkpoint_folder), or update_weights(...) then wake_up()"
        raise AsleepError(f"{what} needs an awake LLM; this one sleeps (level {s.level}"
                          f"{', its weights dropped' if not s.weights_held else ''}): "
                          f"call {how} first")

    def sleep(self, level: int = 1) -> None:
        """Free the device memory (see `dlrt.engine.sleep`): level 1 keeps the weights in CPU
        memory, level 2 drops them.

        Raises:
            OptionError: a level other than 1 or 2. AsleepError: already asleep.
        """
        check_level(level)
        self.check_awake(f"sleep(level={level})")
        self.sleeping = fall_asleep(self, level)

    def check_updatable(self) -> None:
        """Raises AsleepError while asleep at level 1 (the weights are in CPU memory)."""
        s = self.sleeping
        if s is not None and s.level == 1:
            raise AsleepError("update_weights on an LLM asleep at level 1 (its weights in CPU "
                              "memory): call wake_up() first, or wake_up(checkpoint_folder) "
                              "to wake with that folder's weights")

    def plan_update(self, weights: Any, strict: bool = True) -> Update:
        """Check `weights` against the model (`dlrt.checkpoint.update.plan_update`; every
        weight must come while those of `sleep(level=2)` are dropped); nothing is copied.

        Raises:
            WeightsError: as `plan_update`, or weights that are not of a kind it takes.
            AsleepError: asleep at level 1 (the weights are in CPU memory: wake first).
            CheckpointError, OptionError: a folder that cannot be read.
        """
        self.check_updatable()
        s = self.sleeping
        return plan_update(self.model, open_source(weights), strict,
                           complete=s is not None and not s.weights_back)

    def apply_update(self, update: Update) -> int:
        """Copy a checked update into the weights (weights dropped by `sleep(level=2)` get
        device storage first, and stay asleep); the number of checkpoint tensors copied.

        Raises:
            WeightsError: a copy failed (the message says the weights are partly updated;
                while asleep they are dropped again).
        """
        s = self.sleeping
        if s is not None and not s.weights_back:
            restore_weights(s)
            try:
                done = update.apply(self.model)
            except BaseException:
                drop_weights(s)
                raise
            s.level, s.weights_back = 2, True
        else:
            done = update.apply(self.model)
        cache = self.runner.cache
        if update.kv_scales is not None and cache.quantized:
            cache.set_scales(*update.kv_scales)
        if self.config.torch_device.type == "cuda":
            torch.cuda.synchronize(self.config.torch_device)
        return done

    def plan_wake(self, path: Any = None) -> Update | None:
        """The update `wake_up` applies: the weights of checkpoint folder `path` (strict, every
        one), or None without a path.

        Raises:
            AsleepError: no path while the weights of `sleep(level=2)` are dropped.
            WeightsError, CheckpointError, OptionError: as `plan_update`.
        """
        s = self.sleeping
        if path is None:
            if s is not None and not s.weights_held:
                raise AsleepError("wake_up() after sleep(level=2) needs the weights: "
                                  "wake_up(checkpoint_folder), or update_weights(...) first")
            return None
        complete = s is not None and not s.weights_back
        return plan_update(self.model, open_source(path), strict=True, complete=complete)

    def wake_up(self, update: Update | None = None) -> None:
        """Wake (see `dlrt.engine.sleep`), with the weights of `update` (`plan_wake`) when
        given: they replace those kept in CPU memory or dropped. Awake: the update only.

        Raises:
            WeightsError: a copy of `update` failed (the engine stays asleep, its weights
                dropped).
        """
        s = self.sleeping
        if update is not None:
            if s is not None and s.level == 1:
                drop_weights(s)  # the CPU copies give way to the folder's
            self.apply_update(update)
        if s is not None:
            wake(self, s)
            self.sleeping = None
