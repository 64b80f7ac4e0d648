"""Token editing (LLaDA2.1's joint threshold) on hand-made candidates: the round function
(edits, the budget, prompt positions, the mask id), the block's stop rule on its device state
(post passes, the change flag, the cap), and the loop read only through `flag`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dlrt.decoding.options import DecoderDefaults, DecodingOptions, resolve
from dlrt.decoding.round import RoundKind, RoundSpec, denoise_round
from dlrt.decoding.sampling import SamplingMode, SamplingSpec
from dlrt.decoding.strategies import StrategySpec
from dlrt.runtime.decoder import ProgramBase

M = 99  # the mask token
F, T = False, True
GREEDY = SamplingSpec(0.0, 0, 1.0, 0)


def scripted(ids, conf):
    """A candidates op returning fixed (ids [n] int64, conf [n] fp32)."""
    out = (torch.tensor(ids, dtype=torch.int64), torch.tensor(conf, dtype=torch.float32))
    return lambda *args: out


def edit_round(tokens, masked, editable, ids, conf, editing=0.5, threshold=0.5, steps=8,
               round_idx=0):
    spec = RoundSpec(StrategySpec("threshold", threshold, 0.35), GREEDY, steps,
                     editing_threshold=editing, mask_token_id=M)
    new, still, written = denoise_round(
        spec, torch.zeros(len(tokens), 4), torch.tensor(tokens), torch.tensor(masked),
        torch.arange(len(tokens)), round_idx, 1, scripted(ids, conf), torch.tensor(editable))
    assert not (still & ~torch.tensor(masked)).any()  # an edit never masks a position
    return new.tolist(), still.tolist(), written.tolist()


# --- the round function --------------------------------------------------------------------

def test_edits_decided_editable_positions_strictly_above_the_bar():
    tokens = [11, 12, 3, 4, 5, M, M]
    masked = [F, F, F, F, F, T, T]
    editable = [F, F, T, T, T, T, T]  # 0-1: prompt tokens
    ids = [21, 22, 6, 4, 7, 8, 9]
    conf = [1.0, 1.0, 0.75, 0.99, 0.5, 0.875, 0.25]
    new, still, written = edit_round(tokens, masked, editable, ids, conf, editing=0.5)
    # 2: differs, 0.75 > 0.5: edited; 3: same token; 4: 0.5 is not > 0.5; 5: committed
    assert new == [11, 12, 6, 4, 5, 8, M]
    assert written == [F, F, T, F, F, T, F] and still == [F, F, F, F, F, F, T]


def test_prompt_positions_and_the_mask_id_are_never_written_by_an_edit():
    tokens, masked = [11, 12, 3, 4], [F, F, F, F]
    new, _, written = edit_round(tokens, masked, [F, F, T, T], [21, 22, M, 7],
                                 [1.0, 1.0, 1.0, 1.0], editing=0.0)
    assert new == [11, 12, 3, 7] and written == [F, F, F, T]


def test_editing_threshold_zero_rewrites_every_mismatch_with_p_above_zero():
    tokens, masked, editable = [1, 2, 3, 4], [F, F, F, F], [T, T, T, T]
    new, _, _ = edit_round(tokens, masked, editable, [5, 6, 3, 8], [1e-30, 0.5, 0.9, 0.0],
                           editing=0.0)
    assert new == [5, 6, 3, 4]  # 3: no mismatch; 4: p == 0
    new, _, written = edit_round(tokens, masked, editable, [5, 6, 3, 8], [0.9] * 4,
                                 editing=1.0)
    assert new == tokens and not any(written)  # nothing is above 1


def test_no_editing_threshold_is_no_edit():
    tokens, masked = [1, 2, M, M], [F, F, T, T]
    new, still, written = edit_round(tokens, masked, [T] * 4, [5, 6, 7, 8],
                                     [1.0, 1.0, 0.75, 0.25], editing=None)
    assert new == [1, 2, 7, M] and written == [F, F, T, F] and still == [F, F, F, T]


def test_last_round_of_the_budget_commits_every_mask_and_still_edits():
    tokens, masked = [1, 2, M, M], [F, F, T, T]
    new, still, written = edit_round(tokens, masked, [T] * 4, [5, 2, 7, 8],
                                     [0.75, 0.9, 0.125, 0.0625], steps=3, round_idx=2)
    assert new == [5, 2, 7, 8] and not any(still) and written == [T, F, T, T]


def test_device_values_edit_as_host_values():
    args = ([1, 2, 3, M], [F, F, F, T], [F, T, T, T], [5, 6, 3, 8], [0.75, 0.5, 0.9, 0.3])
    for bar in (0.0, 0.5, 0.75):
        assert edit_round(*args, editing=torch.tensor(bar)) == edit_round(*args, editing=bar)


def test_editing_is_part_of_the_round_kind_never_its_value():
    spec = RoundSpec(StrategySpec("threshold", 0.9, 0.35), GREEDY, 4, editing_threshold=0.3)
    kinds = {spec.kind, RoundSpec(spec.strategy, GREEDY, 4, editing_threshold=0.8).kind}
    assert kinds == {RoundKind("threshold", SamplingMode(True), True)}
    assert RoundSpec(spec.strategy, GREEDY, 4).kind == RoundKind("threshold",
                                                                 SamplingMode(True))


# --- a block on its device state: the stop rule ----------------------------------------------

class Script:
    """Candidates per round, as the ops table's `candidates` (the logits are ignored)."""

    def __init__(self, rounds):
        self.rounds, self.calls = rounds, 0

    def __call__(self, *args):
        ids, conf = self.rounds[self.calls]
        self.calls += 1
        return torch.tensor(ids), torch.tensor(conf, dtype=torch.float32)


def run_block(rounds, tokens, masked, editing=0.5, max_post_steps=16, threshold=0.5, steps=None):
    """Decide one block of len(tokens) positions eagerly (flag read between rounds) with the
    scripted candidates; returns (tokens, commit rounds, rounds run, post passes)."""
    b, script = len(tokens), Script(rounds)
    runner = SimpleNamespace(device=torch.device("cpu"), ops=SimpleNamespace(candidates=script),
                             vocab=None)
    kind = RoundKind("threshold", SamplingMode(True), editing is not None)
    prog = ProgramBase("test", runner, kind, b, mask_token_id=M)
    opts = DecodingOptions(remasking_strategy="threshold", threshold=threshold,
                           editing_threshold=editing, max_post_steps=max_post_steps,
                           temperature=0.0, denoising_steps=steps)
    params = resolve(opts, DecoderDefaults(b, "threshold"), {}, (), b, 0)
    s = prog.state
    s.set_values(params)
    s.set_request(sum(masked), params.denoising_steps, 0)
    s.load_block(tokens, masked)
    s.start_block()
    s.update_flag(kind.editing)
    while bool(s.flag.item()):
        prog.commit(torch.zeros(b, 4), torch.arange(b))
    assert script.calls == int(s.round)  # every round ran exactly one scripted draw
    return s.tokens.tolist(), s.commit_round.tolist(), int(s.round), int(s.post)


# Block of 4 after a prompt token: round 0 commits 1-2, round 1 commits 3 and edits 1.
MASK_PHASE = [([9, 5, 6, 1], [1.0, 0.9, 0.9, 0.1]),
              ([9, 7, 6, 8], [1.0, 0.8, 0.9, 0.9])]
START = ([40, M, M, M], [F, T, T, T])
EDIT = ([9, 5, 6, 8], [1.0, 0.9, 0.3, 0.3])  # changes 1 back to 5
STILL = ([9, 7, 6, 8], [1.0, 0.9, 0.9, 0.9])  # changes nothing after MASK_PHASE


def test_max_post_steps_zero_ends_when_no_mask_is_left():
    tokens, commits, rounds, post = run_block(MASK_PHASE, *START, max_post_steps=0)
    assert (tokens, commits, rounds, post) == ([40, 7, 6, 8], [-1, 1, 0, 1], 2, 0)


def test_post_passes_run_while_edits_go_on_up_to_max_post_steps():
    tokens, commits, rounds, post = run_block(MASK_PHASE + [EDIT, ([9, 3, 6, 8], [1.0] * 4)],
                                              *START, max_post_steps=2)
    assert (tokens, commits, rounds, post) == ([40, 3, 6, 8], [-1, 3, 0, 1], 4, 2)


def test_a_post_pass_that_changes_nothing_ends_the_block():
    tokens, commits, rounds, post = run_block(MASK_PHASE + [STILL], *START, max_post_steps=5)
    assert (tokens, commits, rounds, post) == ([40, 7, 6, 8], [-1, 1, 0, 1], 3, 1)
    still = ([9, 5, 6, 8], [1.0] * 4)  # changes nothing after EDIT
    tokens, _, rounds, post = run_block(MASK_PHASE + [EDIT, still], *START, max_post_steps=5)
    assert (tokens, rounds, post) == ([40, 5, 6, 8], 4, 2)


def test_editing_off_ends_at_the_last_mask():
    tokens, commits, rounds, post = run_block(MASK_PHASE, *START, editing=None)
    assert (tokens, commits, rounds, post) == ([40, 5, 6, 8], [-1, 0, 0, 1], 2, 0)


def test_the_budget_still_commits_every_mask_with_editing():
    # T = 1: round 0 commits all three, then post passes
    still = ([9, 5, 6, 1], [1.0] * 4)
    tokens, commits, rounds, _ = run_block([MASK_PHASE[0], still], *START, steps=1,
                                           max_post_steps=3)
    assert (tokens, commits, rounds) == ([40, 5, 6, 1], [-1, 0, 0, 0], 2)


def test_cap_of_block_length_plus_max_post_steps_plus_one():
    runner = SimpleNamespace(device=torch.device("cpu"), ops=None)
    prog = ProgramBase("test", runner, RoundKind("threshold", SamplingMode(True), True), 4)
    s = prog.state
    s.max_post_steps.fill_(3)
    s.masked.fill_(True)
    for r, run in ((0, 1), (7, 1), (8, 0)):  # cap 4 + 3 + 1 = 8
        s.round.fill_(r)
        s.update_flag(True)
        assert int(s.flag) == run
    s.round.zero_()
    s.changed.fill_(False)  # a round that wrote nothing ends the block
    s.update_flag(True)
    assert int(s.flag) == 0


@pytest.mark.parametrize("n_prompt", [0, 1, 3])
def test_prompt_tokens_of_the_block_are_never_edited(n_prompt):
    tokens = [40, 41, 42][:n_prompt] + [M] * (4 - n_prompt)
    masked = [F] * n_prompt + [T] * (4 - n_prompt)
    rounds = [([1, 2, 3, 4], [1.0] * 4)] + [([5 + r, 6 + r, 7 + r, 8 + r], [1.0] * 4)
                                             for r in range(4)]
    out, commits, n_rounds, _ = run_block(rounds, tokens, masked, editing=0.0,
                                          max_post_steps=4)
    assert out[:n_prompt] == tokens[:n_prompt] and commits[:n_prompt] == [-1] * n_prompt
    assert out[n_prompt:] == [8, 9, 10, 11][n_prompt:]  # the last pass's edits
    assert n_rounds == 5
