"""The training run: corpus -> tokenizer -> token streams -> SDAR model trained with the
block-diffusion objective -> held-out accuracy -> the Hugging Face folder.

Every setting is a field of `TrainConfig` (the CLI, `tools/train_default.py`, is generated
from it). Seeded: the corpus split, tokenizer, initial weights, windows and noise are the same
for a seed and a tree; on CUDA the kernels are not bit-deterministic. The cosine schedule runs
on whichever of `steps` or `max_minutes` is nearer its end, so a slower machine still ends on
a decayed learning rate (the run then stops on time, which the record says).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlrt.progress import bar as progress_bar
from dlrt.train.corpus import HELD_OUT_SHARE, load_corpus
from dlrt.train.data import Streams, held_out_windows, prepare, sample_windows
from dlrt.train.evaluate import evaluate
from dlrt.train.export import dlrt_logits_error, write_folder, write_record
from dlrt.train.model import SDARTrainModel, Shape
from dlrt.train.objective import add_noise, block_diffusion_mask, diffusion_loss, noisy_logits
from dlrt.train.tokenizer import SPECIAL_TOKENS


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one run. The defaults take about 3 minutes of training on one H200: 5000
    steps of 64 x 512 tokens, about 63 passes over the 2.6M training tokens of Python 3.12's
    library, with dropout; 12000 steps without it overfit (held-out accuracy fell from 0.569
    at step 5000 to 0.543 while the training loss kept falling)."""

    out: str = _opt("default-model", "output folder (a Hugging Face SDAR checkpoint)")
    steps: int = _opt(5000, "optimizer steps (fewer when max_minutes ends the run first)")
    batch_size: int = _opt(64, "windows per step")
    seq_len: int = _opt(512, "tokens per window (a multiple of both block lengths)")
    lr: float = _opt(2e-3, "peak AdamW learning rate")
    min_lr_ratio: float = _opt(0.1, "final learning rate as a share of lr")
    warmup_steps: int = _opt(300, "linear warm-up steps")
    weight_decay: float = _opt(0.1, "AdamW weight decay of the matrices")
    dropout: float = _opt(0.1, "residual-branch dropout of the attention and MLP outputs")
    grad_clip: float = _opt(1.0, "gradient norm clip")
    block_length: int = _opt(4, "block length of most steps (config.json block_size)")
    long_block_length: int = _opt(8, "the other block length trained")
    long_block_share: float = _opt(0.25, "share of steps with long_block_length")
    eval_every: int = _opt(500, "steps between held-out evaluations")
    eval_windows: int = _opt(256, "held-out windows per evaluation")
    seed: int = _opt(0, "seed of weights, windows and noise")
    max_minutes: float = _opt(11.0, "wall-clock limit of the training loop (minutes)")
    device: str = _opt("auto", "auto (cuda if available), cuda or cpu")
    compile: bool = _opt(True, "torch.compile the model on CUDA (eager if it fails)")
    vocab_size: int = _opt(8192, "tokenizer entries at most (special tokens included)")
    hidden_size: int = _opt(256, "model width")
    num_layers: int = _opt(7, "decoder layers")
    num_heads: int = _opt(4, "attention heads")
    num_kv_heads: int = _opt(2, "key/value heads (GQA)")
    head_dim: int = _opt(64, "head size")
    intermediate_size: int = _opt(768, "SwiGLU width")
    max_position_embeddings: int = _opt(0, "config.json's limit (0: 2 x seq_len)")
    corpus_root: str = _opt("", "corpus folder (empty: this Python's standard library)")
    include_tests: bool = _opt(True, "include the library's test / tests folders")
    held_out_share: float = _opt(HELD_OUT_SHARE, "share of files held out")
    save_dtype: str = _opt("bfloat16", "dtype of the saved weights (bfloat16 or float32)")
    verify: bool = _opt(True, "load the folder with dlrt (CPU) and compare its logits")
    overwrite: bool = _opt(False, "replace the output folder if it exists")
    progress: bool = _opt(True, "show a progress bar (on a terminal)")

    def shape(self, vocab_size: int) -> Shape:
        return Shape(vocab_size=vocab_size, hidden_size=self.hidden_size,
                     intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                     num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                     head_dim=self.head_dim)

    def check(self) -> None:
        """Raises ValueError on settings that cannot run (before any corpus or tokenizer
        work); the message names the flag as the CLI (`tools/train_default.py`) spells it."""
        for name, ok, want in _RULES:
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"{flag(name)} {value}: {want}")
        for name in ("block_length", "long_block_length"):
            if self.seq_len % getattr(self, name):
                raise ValueError(f"--seq-len {self.seq_len} is not a multiple of "
                                 f"{flag(name)} {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"--num-kv-heads {self.num_kv_heads} does not divide "
                             f"--num-heads {self.num_heads}")
        _check_device(self.device)


def flag(name: str) -> str:
    """The command-line flag of the `TrainConfig` field `name` (`tools/train_default.py`)."""
    return "--" + name.replace("_", "-")


def _at_least(low: int):
    return lambda v: v >= low


def _finite_positive(v: float) -> bool:
    return 0 < v < math.inf


def _share(v: float) -> bool:
    return 0.0 <= v <= 1.0


_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # every byte and the special tokens
# (field, test, what a good value is): the checks of TrainConfig.check, in field order
_RULES: tuple[tuple[str, Any, str], ...] = (
    ("steps", _at_least(1), "must be at least 1"),
    ("batch_size", _at_least(1), "must be at least 1"),
    ("seq_len", _at_least(1), "must be at least 1"),
    ("lr", _finite_positive, "must be a finite number > 0"),
    ("min_lr_ratio", _share, "must be in [0, 1]"),
    ("warmup_steps", _at_least(0), "must be at least 0"),
    ("weight_decay", lambda v: 0 <= v < math.inf, "must be a finite number >= 0"),
    ("dropout", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
    ("grad_clip", lambda v: v > 0, "must be > 0"),
    ("block_length", _at_least(1), "must be at least 1"),
    ("long_block_length", _at_least(1), "must be at least 1"),
    ("long_block_share", _share, "must be in [0, 1]"),
    ("eval_every", _at_least(0), "must be at least 0 (0: no evaluations during training)"),
    ("eval_windows", _at_least(1), "must be at least 1"),
    ("max_minutes", _finite_positive, "must be a finite number > 0"),
    ("vocab_size", _at_least(_MIN_VOCAB),
     f"must be at least {_MIN_VOCAB} (256 bytes and {len(SPECIAL_TOKENS)} special tokens)"),
    ("hidden_size", _at_least(1), "must be at least 1"),
    ("num_layers", _at_least(1), "must be at least 1"),
    ("num_heads", _at_least(1), "must be at least 1"),
    ("num_kv_heads", _at_least(1), "must be at least 1"),
    ("head_dim", _at_least(1), "must be at least 1"),
    ("intermediate_size", _at_least(1), "must be at least 1"),
    ("max_position_embeddings", _at_least(0), "must be at least 0 (0: 2 x seq_len)"),
    ("held_out_share", lambda v: 0.0 < v < 1.0, "must be in (0, 1)"),
    ("save_dtype", lambda v: v in ("bfloat16", "float32"), "must be bfloat16 or float32"),
)


def _check_device(name: str) -> None:
    """auto, cpu, cuda or cuda:N; a CUDA device only where CUDA is available."""
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if name in ("auto", "cpu"):
        return
    if match is None:
        raise ValueError(f"--device {name}: must be auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available")
    count = torch.cuda.device_count()
    if match.group(1) is not None and int(match.group(1)) >= count:
        raise ValueError(f"--device {name}: this machine has {count} CUDA device(s)")


@dataclass
class TrainResult:
    folder: Path
    losses: list[float]  # the training loss of every step
    evals: list[dict[str, Any]]  # held-out evaluations, the last after training
    record: dict[str, Any]


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine to lr * min_lr_ratio at progress 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _optimizer(model: SDARTrainModel, cfg: TrainConfig, device: torch.device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    plain = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95),
                             fused=device.type == "cuda")


def train(cfg: TrainConfig) -> TrainResult:
    """Run the whole recipe and write the folder.

    Raises:
        FileExistsError: the output folder exists and `overwrite` is off (checked first).
        ValueError: settings that cannot run, or a corpus too small for one window.
    """
    cfg.check()
    if Path(cfg.out).exists() and not cfg.overwrite:
        raise FileExistsError(f"{cfg.out} exists (pass --overwrite to replace it)")
    device = _device(cfg.device)
    torch.manual_seed(cfg.seed)
    corpus = load_corpus(cfg.corpus_root or None, cfg.include_tests, cfg.held_out_share)
    data = prepare(corpus, cfg.vocab_size, cfg.seq_len, device)
    vocab = -(-data.vocab_size // 64) * 64  # embedding rows padded to a multiple of 64
    model = SDARTrainModel(cfg.shape(vocab), cfg.dropout).to(device)
    c = corpus.record()
    print(f"corpus: {c['tree']} (Python {c['python']}): {c['files']['train']} training and "
          f"{c['files']['held_out']} held-out files, {data.train.numel():,} and "
          f"{data.held_out.numel():,} tokens; tokenizer {data.vocab_size} entries\n"
          f"model: {model.num_parameters():,} parameters on {device}", flush=True)
    losses, evals, run = _fit(model, data, cfg, device)
    evals.append(evaluate(model, held_out_windows(data, cfg), cfg.block_length,
                          data.special["mask"], data.top_token, _autocast(device),
                          step=run["steps"], long_block=cfg.long_block_length))
    record = _record(cfg, corpus, data, model, run, evals, device)
    max_pos = cfg.max_position_embeddings or 2 * cfg.seq_len
    folder = write_folder(cfg.out, model, data.tokenizer, data.special, cfg.block_length,
                          max_pos, record, cfg.save_dtype, cfg.overwrite)
    if cfg.verify:
        ids = data.held_out[: min(64, cfg.seq_len)].cpu()
        err = dlrt_logits_error(folder, model, ids, cfg.block_length, cfg.save_dtype)
        record["dlrt_logits_rel_error"] = err
        write_record(folder, record)
        if err > 1e-3:
            raise RuntimeError(f"dlrt's logits differ from the trained model's by {err:.2e}")
    return TrainResult(folder, losses, evals, record)


def _autocast(device: torch.device):
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def _fit(model: SDARTrainModel, data: Streams, cfg: TrainConfig, device: torch.device):
    opt = _optimizer(model, cfg, device)
    autocast = _autocast(device)

    def step_loss(x_t, x0, masked, t, allow):
        with autocast():
            return diffusion_loss(noisy_logits(model, x_t, x0, allow), x0, masked, t)

    compiled = cfg.compile and device.type == "cuda"
    loss_fn = torch.compile(step_loss) if compiled else step_loss
    gen = torch.Generator(device).manual_seed(cfg.seed)
    pick = torch.Generator().manual_seed(cfg.seed + 1)  # block length of each step
    masks = {b: block_diffusion_mask(cfg.seq_len, b, device)
             for b in (cfg.block_length, cfg.long_block_length)}
    windows = held_out_windows(data, cfg)
    losses: list[torch.Tensor] = []
    evals = [evaluate(model, windows, cfg.block_length, data.special["mask"], data.top_token,
                      autocast, step=0)]
    print(f"step 0: held-out acc {evals[0]['accuracy']:.3f}, unigram baseline "
          f"{evals[0]['unigram_accuracy']:.3f} (mask ratio 0.5, block {cfg.block_length})",
          flush=True)
    limit = cfg.max_minutes * 60
    start, step, stopped = time.perf_counter(), 0, "steps"
    first_step = eval_seconds = 0.0  # the first step holds the compilation
    bar = progress_bar(cfg.steps, "training", unit="step", show=cfg.progress)
    while step < cfg.steps:
        elapsed = time.perf_counter() - start
        if elapsed >= limit:
            stopped = "time"
            break
        progress = max(step / cfg.steps, elapsed / limit)
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step, progress)
        long = torch.rand((), generator=pick).item() < cfg.long_block_share
        block = cfg.long_block_length if long else cfg.block_length
        x0 = sample_windows(data.train, cfg.batch_size, cfg.seq_len, gen)
        x_t, masked, t = add_noise(x0, block, data.special["mask"], gen)
        try:
            loss = loss_fn(x_t, x0, masked, t, masks[block])
            loss.backward()
        except Exception as e:  # NOTE: torch.compile raises many types; fall back to eager
            if loss_fn is step_loss or step:
                raise
            bar.write(f"torch.compile failed ({type(e).__name__}: {e}); training eagerly")
            opt.zero_grad(set_to_none=True)
            loss_fn = step_loss
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        step += 1
        bar.update(1)
        if step == 1:
            first_step = time.perf_counter() - start
        if step % 20 == 0 or step == cfg.steps:
            recent = torch.stack(losses[-20:]).mean().item()
            tps = step * cfg.batch_size * cfg.seq_len / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{recent:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}",
                            tok_s=f"{tps:,.0f}")
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            t0 = time.perf_counter()
            ev = evaluate(model, windows, cfg.block_length, data.special["mask"],
                          data.top_token, autocast, step=step)
            evals.append(ev)
            bar.write(f"step {step}: loss {torch.stack(losses[-cfg.eval_every:]).mean():.3f} "
                      f"held-out acc {ev['accuracy']:.3f} (unigram {ev['unigram_accuracy']:.3f})")
            eval_seconds += time.perf_counter() - t0
    bar.close()
    seconds = time.perf_counter() - start
    window = cfg.batch_size * cfg.seq_len
    run = {"steps": step, "stopped_by": stopped, "minutes": seconds / 60,
           "first_step_seconds": first_step, "eval_seconds": eval_seconds,
           "tokens_seen": step * window,  # clean tokens; each step reads twice as many
           "tokens_per_second": max(step - 1, 0) * window
           / max(seconds - first_step - eval_seconds, 1e-9)}
    return [x.item() for x in losses], evals, run


def _record(cfg: TrainConfig, corpus, data: Streams, model: SDARTrainModel,
            run: dict[str, Any], evals: list[dict[str, Any]], device: torch.device
            ) -> dict[str, Any]:
    final = evals[-1]
    return {
        "corpus": {**corpus.record(), "tokens": {"train": int(data.train.numel()),
                                                 "held_out": int(data.held_out.numel())}},
        "tokenizer": {"vocab_size": data.vocab_size, "special_ids": data.special},
        "model": {**model.shape.as_config(), "parameters": model.num_parameters()},
        "training": {**dataclasses.asdict(cfg), **run,
                     "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                     else "cpu", "torch": torch.__version__},
        "held_out": {"mask_ratio": 0.5, "accuracy": final["accuracy"],
                     "loss": final["loss"], "unigram_accuracy": final["unigram_accuracy"],
                     "long_block": final.get("long_block")},
        "evaluations": evals,
    }
