"""The trainer end to end on a tiny corpus and a tiny model: the loss falls, the folder it
writes loads with dlrt and generates, and dlrt reproduces the training model's logits in both
the plain block-causal layout and the block-diffusion layout it was trained in."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlrt.train.export import RECORD_NAME, saved_copy
from dlrt.train.loop import TrainConfig, lr_at, train
from dlrt.train.model import SDARTrainModel, Shape
from dlrt.train.objective import block_diffusion_mask, diffusion_inputs, fixed_ratio_noise

TINY = dict(steps=40, batch_size=8, seq_len=32, lr=5e-3, warmup_steps=4, eval_every=20,
            eval_windows=8, vocab_size=320, hidden_size=32, num_layers=2, num_heads=2,
            num_kv_heads=1, head_dim=16, intermediate_size=64, held_out_share=0.3,
            progress=False, compile=False, device="cpu")


def _corpus(root: Path) -> Path:
    names = ["alpha", "beta", "gamma", "delta", "omega"]
    for i in range(24):
        lines = [f"def {names[i % 5]}_{j}(value):\n    return value + {j}\n\n" for j in range(12)]
        (root / f"module_{i}.py").write_text("".join(lines))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = _corpus(tmp_path_factory.mktemp("lib"))
    out = tmp_path_factory.mktemp("model") / "tiny-default"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # NOTE: tiny matrices: threads only contend on a shared CPU
    try:
        return train(TrainConfig(out=str(out), corpus_root=str(root), **TINY))
    finally:
        torch.set_num_threads(threads)


def test_loss_falls(run):
    first, last = run.evals[0], run.evals[-1]
    assert first["step"] == 0 and last["step"] == TINY["steps"]
    assert last["loss"] < first["loss"] - 0.5
    assert sum(run.losses[-10:]) < sum(run.losses[:10])
    assert len(run.losses) == TINY["steps"]


def test_folder(run):
    folder = run.folder
    for name in ("config.json", "generation_config.json", "model.safetensors",
                 "tokenizer.json", "tokenizer_config.json", RECORD_NAME):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "sdar" and config["block_size"] == 4
    assert config["mask_token_id"] == 1 and config["eos_token_id"] == 0
    assert config["vocab_size"] % 64 == 0 and config["tie_word_embeddings"]
    record = json.loads((folder / RECORD_NAME).read_text())
    assert record["corpus"]["files"]["train"] + record["corpus"]["files"]["held_out"] == 24
    assert record["corpus"]["tokens"]["train"] > 0
    assert record["training"]["steps"] == TINY["steps"]
    assert record["training"]["stopped_by"] == "steps"
    saved = load_file(str(folder / "model.safetensors"))
    assert record["model"]["parameters"] == sum(t.numel() for t in saved.values())
    assert "lm_head.weight" not in saved  # tied to model.embed_tokens.weight
    assert 0 <= record["held_out"]["accuracy"] <= 1
    assert 0 <= record["held_out"]["unigram_accuracy"] <= 1
    assert record["held_out"]["long_block"]["block_length"] == 8
    assert record["dlrt_logits_rel_error"] < 1e-5


def test_dlrt_generates(run):
    from dlrt.llm import LLM

    llm = LLM(str(run.folder), device="cpu")
    out = llm.generate("def alpha_3(value):\n", max_new_tokens=8)
    assert out.token_ids and all(0 <= t < llm.config.vocab_size for t in out.token_ids)
    chat = llm.generate([{"role": "user", "content": "add one"}], max_new_tokens=4,
                        block_length=8)
    assert chat.prompt_token_ids[0] == llm.tokenizer.encode("#", add_special_tokens=False)[0]


def test_dlrt_reproduces_the_training_layout(run):
    """A noisy block's logits in the training forward ([x_t; x0] under the block-diffusion
    mask) equal dlrt's block-causal forward of the clean prefix followed by that block."""
    from dlrt.llm import LLM

    config = json.loads((run.folder / "config.json").read_text())
    shape = Shape(**{k: config[k] for k in Shape.__dataclass_fields__})
    model = SDARTrainModel(shape)
    model.load_state_dict(load_file(str(run.folder / "model.safetensors")), strict=False)
    model = saved_copy(model, "float32")
    llm = LLM(str(run.folder), device="cpu", dtype="float32")
    n, b = 16, 4
    x0 = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(0))
    x_t, _ = fixed_ratio_noise(x0, b, config["mask_token_id"], 0.5,
                               torch.Generator().manual_seed(1))
    ids, pos = diffusion_inputs(x_t, x0)
    with torch.no_grad():
        train_logits = model.logits(model(ids, pos, block_diffusion_mask(n, b))[0, :n])
    for i in range(n // b):
        seq = torch.cat((x0[0, : i * b], x_t[0, i * b:(i + 1) * b]))
        ours = llm.runner.forward_at(seq, 0, chunk_block=b)[-b:]
        want = train_logits[i * b:(i + 1) * b]
        assert ((ours - want).norm() / want.norm()).item() < 1e-5, i


def test_schedule():
    cfg = TrainConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(cfg, 0, 0.0) == pytest.approx(0.1)
    assert lr_at(cfg, 10, 0.0) == pytest.approx(1.0)
    assert lr_at(cfg, 50, 0.5) == pytest.approx(0.55)
    assert lr_at(cfg, 99, 1.0) == pytest.approx(0.1)
    assert lr_at(cfg, 99, 2.0) == pytest.approx(0.1)  # past the time limit: the floor


def _tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "train_default.py"
    spec = importlib.util.spec_from_file_location("train_default", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_cli_flags_are_the_config_fields():
    tool = _tool()
    args = tool.parser().parse_args(["--steps", "5", "--no-compile", "--out", "x"])
    cfg = TrainConfig(**vars(args))
    assert cfg.steps == 5 and not cfg.compile and cfg.out == "x"
    assert cfg.batch_size == TrainConfig().batch_size


def test_refuses_an_existing_folder(tmp_path):
    with pytest.raises(FileExistsError):
        train(TrainConfig(out=str(tmp_path)))
    with pytest.raises(ValueError, match="multiple"):
        TrainConfig(seq_len=30).check()


def test_default_model_size():
    """The default shape stays within 8M parameters, the embedding (tied head) included."""
    model = SDARTrainModel(TrainConfig().shape(8192))
    assert model.num_parameters() == 7_606_912 <= 8_000_000
    assert TrainConfig().seq_len % 8 == 0


def test_dropout_only_in_training():
    """Residual dropout changes the training forward and leaves the eval forward equal to the
    model without it (same weights); a probability outside [0, 1) is refused."""
    shape = Shape(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    plain = SDARTrainModel(shape)
    drop = SDARTrainModel(shape, dropout=0.5)
    drop.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    pos, allow = torch.arange(8), block_diffusion_mask(8, 4)[:8, :8]
    with torch.no_grad():
        want = plain.eval()(ids, pos, allow)
        assert torch.equal(drop.eval()(ids, pos, allow), want)
        drop.train()
        a, b = drop(ids, pos, allow), drop(ids, pos, allow)
    assert not torch.equal(a, b) and not torch.equal(a, want)
    with pytest.raises(ValueError, match="dropout"):
        SDARTrainModel(shape, dropout=1.0)
    with pytest.raises(ValueError, match="dropout"):
        TrainConfig(dropout=-0.1).check()


@pytest.mark.parametrize(("name", "value"), [
    ("steps", 0), ("batch_size", 0), ("seq_len", 0), ("seq_len", -8), ("block_length", 0),
    ("long_block_length", 0), ("long_block_length", -4), ("lr", 0.0), ("lr", -1e-3),
    ("lr", math.nan), ("lr", math.inf), ("min_lr_ratio", -0.1), ("min_lr_ratio", 1.5),
    ("warmup_steps", -1), ("weight_decay", -0.1), ("grad_clip", 0.0), ("grad_clip", -1.0),
    ("long_block_share", -0.5), ("long_block_share", 1.5), ("eval_every", -1),
    ("eval_windows", 0), ("max_minutes", 0.0), ("max_minutes", -1.0),
    ("max_minutes", math.inf), ("max_minutes", math.nan), ("vocab_size", 100),
    ("vocab_size", 258), ("hidden_size", 0), ("num_layers", 0), ("num_heads", 0),
    ("num_kv_heads", 0), ("head_dim", 0), ("intermediate_size", 0), ("held_out_share", 0.0),
    ("held_out_share", 1.0), ("held_out_share", -0.2), ("dropout", 1.0), ("dropout", -0.1),
    ("device", "gpu"), ("device", "cuda:x"), ("device", "CPU"), ("save_dtype", "fp16"),
])
def test_check_names_the_flag_and_value(name, value):
    """A setting that cannot run is refused by check() (before any corpus work) with a
    message naming the flag as the CLI spells it and the bad value."""
    with pytest.raises(ValueError) as info:
        TrainConfig(**{name: value}).check()
    message = str(info.value)
    assert "--" + name.replace("_", "-") in message, message
    assert str(value) in message, message
    assert len(message) < 120 and "\n" not in message


def test_check_accepts_the_edges():
    TrainConfig().check()
    TrainConfig(min_lr_ratio=0.0, warmup_steps=0, weight_decay=0.0, dropout=0.0,
                long_block_share=1.0, eval_every=0, vocab_size=259, device="cpu").check()
    TrainConfig(min_lr_ratio=1.0, long_block_share=0.0, held_out_share=0.99).check()


def test_check_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=f"--device {device}.*CUDA is not available"):
            TrainConfig(device=device).check()
    TrainConfig(device="auto").check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    TrainConfig(device="cuda").check()
    TrainConfig(device="cuda:1").check()
    with pytest.raises(ValueError, match="--device cuda:2"):
        TrainConfig(device="cuda:2").check()


def test_block_flag_named():
    with pytest.raises(ValueError, match="--block-length 0") as info:
        TrainConfig(block_length=0).check()
    assert "multiple" not in str(info.value)
    with pytest.raises(ValueError, match="--seq-len 30.*--block-length 4"):
        TrainConfig(seq_len=30).check()
    with pytest.raises(ValueError, match="--seq-len 36.*--long-block-length 8"):
        TrainConfig(seq_len=36).check()
    with pytest.raises(ValueError, match="--num-kv-heads 3.*--num-heads 4"):
        TrainConfig(num_kv_heads=3).check()


@pytest.mark.parametrize(("argv", "words"), [
    (["--steps", "0"], "--steps 0"),
    (["--lr", "nan"], "--lr nan"),
    (["--block-length", "0"], "--block-length 0"),
    (["--vocab-size", "10"], "--vocab-size 10"),
])
def test_tool_prints_one_error_line(argv, words, tmp_path, capsys):
    """A user error: exit status 2 and one `error: ...` line on stderr, no traceback."""
    with pytest.raises(SystemExit) as info:
        _tool().main(["--out", str(tmp_path / "m"), "--device", "cpu",
                      "--corpus-root", str(tmp_path / "no-corpus"), *argv])
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "m").exists()


def test_tool_existing_folder_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        _tool().main(["--out", str(tmp_path), "--device", "cpu"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "--overwrite" in err and "Traceback" not in err


def test_tool_keeps_tracebacks_for_bugs(tmp_path, monkeypatch):
    tool = _tool()

    def broken(cfg):
        raise KeyError("a bug")

    monkeypatch.setattr(tool, "train", broken)
    with pytest.raises(KeyError):
        tool.main(["--out", str(tmp_path / "m")])


def test_folder_permissions_follow_the_umask(run, tmp_path):
    """The folder and its files get the modes a plain mkdir / open give (not mkdtemp's 700
    nor safetensors' 600)."""
    umask = os.umask(0)
    os.umask(umask)
    folder = run.folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name
