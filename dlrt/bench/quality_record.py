"""`dlrt bench quality` while it runs: the JSON record rewritten after every setting (a partial
record, `"complete": false`, that `--resume` continues), and the time estimates it prints."""

from __future__ import annotations

import json
import os
from operator import eq
from pathlib import Path
from typing import Any

from dlrt.bench.report import same_device
from dlrt.errors import OptionError

# what a record must share with the run that resumes it (else its rows do not compare); a
# record (or facts) without a field has its value in `UNSET` (records written before it was
# recorded)
SAME = ("model", "device", "execution_mode", "options", "heldout", "humaneval")
UNSET = {"options": {}}


def update_record(path: Path, **fields: Any) -> None:
    """Replace `fields` of the JSON record at `path`, atomically (a reader, or a run stopped
    while it writes, sees the old record or the new one, never a part)."""
    record = json.loads(path.read_text())
    record.update(fields)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)


def read_record(path: str | Path) -> dict[str, Any]:
    """The `bench quality` record at `path` (read before the model loads).

    Raises:
        OptionError: "--resume: ..." naming an unreadable record.
    """
    try:
        record = json.loads(Path(path).read_text())
        if not isinstance(record, dict) or not isinstance(record.get("rows"), list):
            raise ValueError("no list of rows")
    except (OSError, ValueError) as e:
        raise OptionError(f"--resume: {path} is not a bench quality record ({e})") from None
    return record


def resumed_rows(path: str | Path, facts: dict[str, Any],
                 record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of the record at `path` (`record`: as `read_record` read it), after checking
    that it is a `bench quality` record whose `SAME` fields equal `facts`' (the device's, the
    CPU's thread count aside: the record keeps the count it was first measured with).

    Raises:
        OptionError: "--resume: ..." naming an unreadable record or the first field that
            differs (its value there and here).
    """
    record = read_record(path) if record is None else record
    for key in SAME:
        value, here = record.get(key, UNSET.get(key)), facts.get(key, UNSET.get(key))
        same = same_device if key == "device" and isinstance(value, str) else eq
        if not same(value, here):
            raise OptionError(f"--resume: {path} was measured with another {key} "
                              f"({value!r}; this run: {here!r})")
    return list(record["rows"])


def duration(seconds: float) -> str:
    """"45 s", "12 min", "1 h 05 min"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def first_estimate(heldout_s: float, humaneval_s: float, settings: int, samples: int,
                   prompts: int) -> str:
    """About how long the run takes, from one held-out request and one HumanEval request of
    the first setting (the first setting's rule for every setting)."""
    seconds = settings * (samples * heldout_s + prompts * humaneval_s)
    return (f"about {duration(seconds)} for {settings} setting(s) of {samples} held-out and "
            f"{prompts} HumanEval request(s) (one of each took {heldout_s:.2f} s and "
            f"{humaneval_s:.2f} s in the first setting); updated after each setting")


def left(seconds_done: list[float], settings_left: int) -> str:
    """The time left at the mean seconds per setting so far."""
    if not settings_left:
        return "done"
    mean = sum(seconds_done) / max(len(seconds_done), 1)
    return f"about {duration(mean * settings_left)} left"
