"""The `n` choices of an OpenAI request: one run each, one after another in the request's one
turn of the queue (`Job.runs`). Run i samples with seed `(s + i) mod 2^63`, s being the
request's `seed`, else the server's default seed, else a fresh random one, so a request with a
seed gives the same n choices every time. As vLLM does, `n` > 1 is refused when decoding is
greedy (temperature 0, no `random` remasking, no renoising): every choice would be the same."""

from __future__ import annotations

from typing import Any

from dlrt.decoding.options import DecodingOptions, DecodingParams
from dlrt.server.errors import HTTPError
from dlrt.server.state import ServerState
from dlrt.server.worker import Job


def uses_seed(params: DecodingParams) -> bool:
    """Whether the seed changes the output of a request with these resolved params."""
    return (params.sampling.temperature > 0 or params.strategy.name == "random"
            or params.renoise is not None)


def choice_runs(state: ServerState, job: Job, n: int) -> tuple[dict[str, Any], ...]:
    """The runs (`Job.runs`) of a prepared request asking for `n` choices.

    Raises:
        HTTPError: 400 naming `n` when n > 1 and the request decodes greedily.
    """
    if n == 1:
        return ({},)
    params = state.llm.resolve(DecodingOptions.from_kwargs({**state.defaults, **job.options}))
    if not uses_seed(params):
        raise HTTPError(400, f"n={n} needs sampling: this request decodes greedily "
                             f"(temperature 0), so its {n} choices would be the same; set "
                             f"temperature > 0, or n to 1", "n")
    seed = params.sampling.seed  # the request's, else the server's default, else random
    return tuple({"seed": (seed + i) % 2**63} for i in range(n))
