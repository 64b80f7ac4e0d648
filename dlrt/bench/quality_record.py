"""`dlrt bench quality` while it runs: the JSON record rewritten after every setting (a partial
record, `"complete": false`, that `--resume` continues), and the time estimates it prints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# what a record must share with the run that resumes it (else its rows do not compare)
SAME = ("model", "device", "execution_mode", "heldout", "humaneval")


def update_record(path: Path, **fields: Any) -> None:
    """Replace `fields` of the JSON record at `path`, atomically (a reader, or a run stopped
    while it writes, sees the old record or the new one, never a part)."""
    record = json.loads(path.read_text())
    record.update(fields)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)


def resumed_rows(path: str | Path, facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the record at `path`, after checking that it is a `bench quality` record
    whose `SAME` fields equal `facts`'.

    Raises:
        SystemExit: "--resume: ..." naming an unreadable record or the first field that
            differs (its value there and here).
    """
    try:
        record = json.loads(Path(path).read_text())
        rows = record["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--resume: {path} is not a bench quality record ({e})") from None
    for key in SAME:
        if record.get(key) != facts[key]:
            raise SystemExit(f"--resume: {path} was measured with another {key} "
                             f"({record.get(key)!r}; this run: {facts[key]!r})")
    return list(rows)


def duration(seconds: float) -> str:
    """"45 s", "12 min", "1 h 05 min"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def first_estimate(probe_s: float, probe_tokens: int, settings: int, samples: int,
                   new_tokens: int, prompts: int, humaneval_tokens: int) -> str:
    """What the run will take at most, from one timed request of the first setting: every
    setting's tokens (held-out samples x new_tokens, HumanEval prompts x humaneval_tokens,
    their limit) at that request's seconds per token."""
    per_setting = samples * new_tokens + prompts * humaneval_tokens
    seconds = probe_s / max(probe_tokens, 1) * per_setting * settings
    return (f"about {duration(seconds)} at most for {settings} setting(s) of {samples} held-out "
            f"and {prompts} HumanEval request(s) (one request of the first setting took "
            f"{probe_s:.2f} s for {probe_tokens} tokens); the estimate is updated after each "
            "setting")


def left(seconds_done: list[float], settings_left: int) -> str:
    """The time left at the mean seconds per setting so far."""
    if not settings_left:
        return "done"
    mean = sum(seconds_done) / max(len(seconds_done), 1)
    return f"about {duration(mean * settings_left)} left"
