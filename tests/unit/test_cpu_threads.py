"""The CPU thread count (`cpu_threads`): `auto` runs a small model on one thread and a large
one on the idle cores this process may use, keeps torch's count under OMP_NUM_THREADS, several
ranks or CUDA; a count given is used; the engine applies it on the CPU."""

from __future__ import annotations

import pytest
import torch

from dlrt.engine import cpu_threads as ct
from dlrt.errors import OptionError
from dlrt.models.config import ModelConfig

STAT0 = "cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0 0 0\n"
# cpu0 busy for all of the 100 jiffies after, cpu1 for a quarter of them
STAT1 = "cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 105 0 5 40 0 0 0 0 0 0\ncpu1 25 0 10 115 0 0 0 0 0 0\n"


def config(hidden: int, layers: int = 7, vocab: int = 8192, **moe) -> ModelConfig:
    return ModelConfig(family="sdar", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=3 * hidden, num_layers=layers, num_heads=hidden // 64,
                       num_kv_heads=hidden // 128, head_dim=64, rms_norm_eps=1e-6,
                       rope_theta=1e4, max_position_embeddings=1024, tie_word_embeddings=True,
                       initializer_range=0.02, mask_token_id=1, eos_token_ids=(0,),
                       block_size=4, **moe)


SMALL, LARGE = config(256), config(2048, layers=28, vocab=151936)


def test_token_weights():
    # the embedded default model: 7,606,912 parameters, of which 4,736 are norm weights
    assert ct.token_weights(SMALL) == 7_606_912 - 4_736
    assert ct.token_weights(LARGE) > 1_000_000_000
    dense = ct.token_weights(config(512))
    moe = ct.token_weights(config(512, num_experts=64, num_experts_per_tok=2,
                                  moe_intermediate_size=128, moe_layers=tuple(range(7))))
    assert moe == dense - 7 * 3 * 512 * (3 * 512 - 2 * 128)  # a token reads 2 small experts


@pytest.mark.parametrize("usable, busy, want", [
    (16, 0.2, 16),
    (16, 1.0, 15),  # a busy core is left to its owner
    (2, 1.1, 1),
    (2, 2.0, 1),
    (1, 0.0, 1),
])
def test_choose(usable, busy, want):
    assert ct.choose(usable, busy) == want


def test_busy_cores_from_proc_stat():
    assert ct.busy_between(STAT0, STAT1, {0, 1}) == pytest.approx(1.25)
    assert ct.busy_between(STAT0, STAT1, {1}) == pytest.approx(0.25)
    assert ct.busy_between(STAT0, STAT1, {5}) == 0.0


def test_usable_cores_within_the_cgroup_quota(tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    assert ct.usable_cores({0, 1, 2, 3, 6, 7}, quota) == {0, 1}  # 1.5 CPUs: two may run
    quota.write_text("max 100000\n")
    assert ct.usable_cores({2, 3}, quota) == {2, 3}
    assert ct.usable_cores({2, 3}, tmp_path / "missing") == {2, 3}


@pytest.fixture
def machine(monkeypatch):
    """16 usable cores, of which `machine.busy` are busy; OMP_NUM_THREADS unset."""
    class Machine:
        busy = 0.0
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(ct, "usable_cores", lambda: set(range(16)))
    monkeypatch.setattr(ct, "busy_cores", lambda cpus: Machine.busy)
    return Machine


@pytest.fixture
def three_threads():
    """torch runs 3 threads (neither a small model's answer nor a large one's on `machine`);
    its count is restored after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


def test_auto(machine, monkeypatch, three_threads):
    cpu = torch.device("cpu")
    assert ct.resolve_cpu_threads("auto", cpu, SMALL) == 1
    assert ct.resolve_cpu_threads("auto", cpu, LARGE) == 16
    machine.busy = 3.0
    assert ct.resolve_cpu_threads("auto", cpu, LARGE) == 13
    for model in (SMALL, LARGE):  # torch's count is kept
        assert ct.resolve_cpu_threads("auto", torch.device("cuda"), model) == three_threads
        assert ct.resolve_cpu_threads("auto", cpu, model, ranks=2) == three_threads
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    for model in (SMALL, LARGE):  # torch read it at start
        assert ct.resolve_cpu_threads("auto", cpu, model) == three_threads


def test_a_small_model_does_not_watch_the_cores(machine, monkeypatch):
    def watched(cpus):
        raise AssertionError("watched the cores for a small model")

    monkeypatch.setattr(ct, "busy_cores", watched)
    assert ct.resolve_cpu_threads("auto", torch.device("cpu"), SMALL) == 1


def test_a_count_given_is_kept(machine):
    assert ct.resolve_cpu_threads(3, torch.device("cpu"), SMALL) == 3
    assert ct.resolve_cpu_threads("5", torch.device("cpu"), LARGE) == 5  # from the flag
    assert ct.resolve_cpu_threads(16, torch.device("cpu"), LARGE) == 16


@pytest.mark.parametrize("value", [17, "100000"])
def test_more_threads_than_usable_cores_are_refused(machine, value):
    """100000 threads crashed OpenMP (a segmentation fault, no message)."""
    with pytest.raises(OptionError, match=rf"^cpu_threads={value!r}: this process may run on "
                                          r"16 CPU core\(s\) .* pass at most 16$"):
        ct.resolve_cpu_threads(value, torch.device("cpu"), SMALL)


@pytest.mark.parametrize("value", [0, -2, "0", "many", 2.5, True])
def test_bad_counts_are_named(value):
    from dlrt.engine.config import EngineConfig

    with pytest.raises(OptionError, match="^cpu_threads must be 'auto' or a count >= 1"):
        EngineConfig.from_kwargs(cpu_threads=value)


def test_the_engine_applies_it_on_the_cpu(tiny_sdar, machine):
    from dlrt import LLM

    before = torch.get_num_threads()
    try:
        for n in (2, 1):
            llm = LLM(tiny_sdar, device="cpu", cpu_threads=n)
            assert llm.engine_config.cpu_threads == n and torch.get_num_threads() == n
        torch.set_num_threads(2)
        llm = LLM(tiny_sdar, device="cpu")  # auto: 19.5M weights per token, small
        assert llm.engine_config.cpu_threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_flag(tiny_sdar):
    from dlrt.entrypoints.cli import build_parser, engine_kwargs

    args = build_parser().parse_args(["generate", "--prompt", "x", "--cpu-threads", "3"])
    assert engine_kwargs(args)["cpu_threads"] == "3"
    args = build_parser().parse_args(["generate", "--prompt", "x"])
    assert engine_kwargs(args)["cpu_threads"] == "auto"
